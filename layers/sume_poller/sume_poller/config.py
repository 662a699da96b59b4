"""Configuration: read once from the environment, validated, frozen.

Every function reads the same variables (set by ``Globals.Function.Environment`` in
``template.yaml``). A bad value fails the cold start with one error that names every
problem, instead of failing later on the first message that needs it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit, urlunsplit

#: SQS rejects DelaySeconds above this; longer waits are re-queued in hops.
SQS_MAX_DELAY_SECONDS = 900


class ConfigError(ValueError):
    """The environment does not describe a usable configuration."""


@dataclass(frozen=True, slots=True)
class Settings:
    jobs_table: str
    poll_queue_url: str
    event_bus_name: str
    sume_base_url: str
    sume_api_key_name: str
    sume_api_key_source: str  # "ssm" | "secretsmanager"
    redis_url: str
    lease_key_prefix: str = "sume:poll:"
    job_max_age_seconds: int = 86_400
    max_poll_attempts: int = 720
    pending_shards: int = 8
    # Timeouts and margins (seconds).
    sume_connect_timeout: float = 3.0
    sume_read_timeout: float = 10.0
    redis_timeout: float = 2.0
    lease_margin_seconds: int = 30
    #: Lease TTL while one message is processed; must outlast the poll function's timeout.
    claim_ttl_seconds: int = 60
    #: Largest DelaySeconds this deployment sends (<= 900; lowered only by tests to exercise hops).
    max_delay_seconds: int = SQS_MAX_DELAY_SECONDS
    #: Stop taking new work when less than this much of the invocation is left.
    safety_margin_ms: int = 3_000
    #: How long a 401/403 from Sume pauses fan-out (the "auth breaker").
    auth_pause_seconds: int = 300

    @property
    def redis_url_for_logs(self) -> str:
        """The Redis URL with any password removed."""
        return redact_url(self.redis_url)


def redact_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))


_REQUIRED = {
    "JOBS_TABLE": "jobs_table",
    "POLL_QUEUE_URL": "poll_queue_url",
    "SUME_BASE_URL": "sume_base_url",
    "SUME_API_KEY_NAME": "sume_api_key_name",
    "REDIS_URL": "redis_url",
}

#: Optional numeric variables: field, type, minimum, maximum.
_NUMBERS: dict[str, tuple[str, type[int] | type[float], float, float]] = {
    "JOB_MAX_AGE_SECONDS": ("job_max_age_seconds", int, 60, 366 * 86_400),
    "MAX_POLL_ATTEMPTS": ("max_poll_attempts", int, 1, 1_000_000),
    "PENDING_SHARDS": ("pending_shards", int, 1, 64),
    "LEASE_MARGIN_SECONDS": ("lease_margin_seconds", int, 1, 3_600),
    "CLAIM_TTL_SECONDS": ("claim_ttl_seconds", int, 1, 900),
    "MAX_DELAY_SECONDS": ("max_delay_seconds", int, 1, SQS_MAX_DELAY_SECONDS),
    "SAFETY_MARGIN_MS": ("safety_margin_ms", int, 0, 60_000),
    "AUTH_PAUSE_SECONDS": ("auth_pause_seconds", int, 1, 86_400),
    "SUME_CONNECT_TIMEOUT": ("sume_connect_timeout", float, 0.05, 30.0),
    "SUME_READ_TIMEOUT": ("sume_read_timeout", float, 0.05, 60.0),
    "REDIS_TIMEOUT": ("redis_timeout", float, 0.05, 30.0),
}


def load_settings(env: Mapping[str, str]) -> Settings:
    """Build and validate settings from an environment mapping."""
    problems: list[str] = []
    values: dict[str, object] = {}
    for var, field in _REQUIRED.items():
        value = env.get(var, "").strip()
        if not value:
            problems.append(f"{var} is required")
        values[field] = value
    values["event_bus_name"] = env.get("EVENT_BUS_NAME", "default").strip() or "default"

    source = env.get("SUME_API_KEY_SOURCE", "ssm").strip().lower()
    if source not in {"ssm", "secretsmanager"}:
        problems.append(f"SUME_API_KEY_SOURCE must be ssm or secretsmanager, not {source!r}")
    values["sume_api_key_source"] = source

    base = str(values["sume_base_url"]).rstrip("/")
    if base and urlsplit(base).scheme not in {"http", "https"}:
        problems.append("SUME_BASE_URL must be an http(s) URL")
    values["sume_base_url"] = base

    redis_url = str(values["redis_url"])
    if redis_url and urlsplit(redis_url).scheme not in {"redis", "rediss"}:
        problems.append("REDIS_URL must start with redis:// or rediss://")

    prefix = env.get("LEASE_KEY_PREFIX", "sume:poll:")
    if not prefix or len(prefix) > 64:
        problems.append("LEASE_KEY_PREFIX must be 1-64 characters")
    values["lease_key_prefix"] = prefix

    for var, (field, kind, lo, hi) in _NUMBERS.items():
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        try:
            number = kind(raw)
        except ValueError:
            problems.append(f"{var} must be {'an integer' if kind is int else 'a number'}, not {raw!r}")
            continue
        if not lo <= number <= hi:
            problems.append(f"{var} must be between {lo} and {hi}, not {number}")
        values[field] = number

    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))
    return Settings(**values)  # type: ignore[arg-type]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from ``os.environ`` on first use."""
    return load_settings(os.environ)
