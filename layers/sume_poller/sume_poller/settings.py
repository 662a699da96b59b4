"""Settings: read once per container from the environment, validated, frozen.

Each function gets the settings it reads (:class:`PollSettings`, :class:`FanOutSettings`,
:class:`SubmitSettings`), built from small groups (:class:`SumeSettings`,
:class:`RedisSettings`, ...). ``template.yaml`` sets the variables; a missing or bad value
fails the cold start with :class:`ConfigError`, which lists every problem, one line each,
naming the variable - instead of failing later on the first message that needs it.

Times are clock seconds (see :mod:`sume_poller.clock`) unless a name or docstring says real:
socket timeouts and the lease's margins (processing and queueing lag) are spent in real time
whatever ``TIME_SCALE`` says.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self
from urllib.parse import urlsplit

from .clock import Clock

#: SQS rejects DelaySeconds above this; longer waits are re-queued in hops.
SQS_MAX_DELAY_SECONDS = 900


class ConfigError(ValueError):
    """The environment does not describe a usable configuration."""


class Env:
    """Reads typed values from an environment mapping and collects every problem."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env
        self.problems: list[str] = []

    def text(self, name: str, default: str | None = None) -> str:
        value = self._env.get(name, "").strip()
        if value:
            return value
        if default is None:
            self.problems.append(f"{name} is required")
            return ""
        return default

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        value = self.text(name, default).lower()
        if value not in choices:
            self.problems.append(f"{name} must be one of {', '.join(choices)}, not {value!r}")
            return default
        return value

    def flag(self, name: str, default: bool) -> bool:
        return self.choice(name, ("true", "false"), "true" if default else "false") == "true"

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        raw = self._env.get(name, "").strip()
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            self.problems.append(f"{name} must be an integer, not {raw!r}")
            return default
        if not low <= value <= high:
            self.problems.append(f"{name} must be between {low} and {high}, not {value}")
            return default
        return value

    def number(self, name: str, default: float, low: float, high: float) -> float:
        raw = self._env.get(name, "").strip()
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            self.problems.append(f"{name} must be a number, not {raw!r}")
            return default
        if not low <= value <= high:
            self.problems.append(f"{name} must be between {low:g} and {high:g}, not {value:g}")
            return default
        return value

    def check(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    def raise_problems(self, what: str) -> None:
        if self.problems:
            raise ConfigError(f"invalid {what} configuration:\n  - " + "\n  - ".join(self.problems))


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Common:
    jobs_table: str
    clock: Clock
    #: Set only for local emulators: allows http:// Sume and a loopback Redis.
    local_endpoints: bool

    @classmethod
    def read(cls, env: Env) -> Self:
        return cls(jobs_table=env.text("JOBS_TABLE"),
                   clock=Clock(env.number("TIME_SCALE", 1.0, 0.0001, 1.0)),
                   local_endpoints=env.flag("LOCAL_ENDPOINTS", False))


@dataclass(frozen=True, slots=True)
class SumeSettings:
    base_url: str
    api_key_name: str
    api_key_source: str  # "ssm" | "secretsmanager"
    connect_timeout_real: float = 3.0
    read_timeout_real: float = 10.0

    @classmethod
    def read(cls, env: Env, local: bool) -> Self:
        base = env.text("SUME_BASE_URL").rstrip("/")
        parts = urlsplit(base)
        env.check(not base or parts.scheme == "https" or (parts.scheme == "http" and local),
                  f"SUME_BASE_URL must be an https URL (http only with LOCAL_ENDPOINTS=true), not {base!r}")
        return cls(base_url=base,
                   api_key_name=env.text("SUME_API_KEY_NAME"),
                   api_key_source=env.choice("SUME_API_KEY_SOURCE", ("ssm", "secretsmanager"), "ssm"),
                   connect_timeout_real=env.number("SUME_CONNECT_TIMEOUT", 3.0, 0.05, 30.0),
                   read_timeout_real=env.number("SUME_READ_TIMEOUT", 10.0, 0.05, 60.0))


@dataclass(frozen=True, slots=True)
class RedisSettings:
    url: str
    mode: str  # "standalone" | "cluster"
    #: Secrets Manager secret with {"username": ..., "password": ...} (ElastiCache RBAC); optional.
    secret_name: str | None
    key_prefix: str = "sume:poll:"
    timeout_real: float = 1.0

    @classmethod
    def read(cls, env: Env, local: bool) -> Self:
        url = env.text("REDIS_URL")
        parts = urlsplit(url)
        env.check(not url or parts.scheme in ("redis", "rediss"),
                  "REDIS_URL must start with redis:// or rediss://")
        env.check(parts.password is None and parts.username is None,
                  "REDIS_URL must not carry credentials: put them in the secret named by REDIS_SECRET_NAME")
        env.check(not url or local or not is_loopback(parts.hostname),
                  f"REDIS_URL points at {parts.hostname}: a loopback Redis is only valid with LOCAL_ENDPOINTS=true")
        prefix = env.text("LEASE_KEY_PREFIX", "sume:poll:")
        env.check(len(prefix) <= 64 and "{" not in prefix and "}" not in prefix,
                  "LEASE_KEY_PREFIX must be at most 64 characters without braces")
        return cls(url=url, mode=env.choice("REDIS_MODE", ("standalone", "cluster"), "standalone"),
                   secret_name=env.text("REDIS_SECRET_NAME", "") or None, key_prefix=prefix,
                   timeout_real=env.number("REDIS_TIMEOUT", 1.0, 0.05, 10.0))


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """Real seconds: they cover processing and queueing lag, which a compressed clock does not shorten."""

    #: Lease time beyond each re-queue delay (SQS and Lambda lag, including a queue backlog).
    margin: int = 120
    #: Lease time while one message is processed (longer than the poll function's timeout).
    claim_ttl: int = 60
    #: Lease time of a chain that submit or fan-out just started: how long its first message
    #: may wait in the queue before a fan-out tick may start another chain for the job.
    start_ttl: int = 600

    @classmethod
    def read(cls, env: Env) -> Self:
        return cls(margin=env.integer("LEASE_MARGIN_SECONDS", 120, 1, 3_600),
                   claim_ttl=env.integer("CLAIM_TTL_SECONDS", 60, 1, 900),
                   start_ttl=env.integer("START_LEASE_SECONDS", 600, 1, 86_400))


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    """Sume's per-key budgets (0 = not limited here). Defaults: Sume's documented numbers."""

    reads_per_minute: int = 120
    reads_per_day: int = 10_000
    creates_per_minute: int = 10
    creates_per_day: int = 300
    #: Poll invocations that may run at once: the local pacing while Redis is down divides the
    #: budget by it, so every container together stays inside the budget.
    max_concurrency: int = 5

    @classmethod
    def read(cls, env: Env) -> Self:
        return cls(reads_per_minute=env.integer("READS_PER_MINUTE", 120, 0, 1_000_000),
                   reads_per_day=env.integer("READS_PER_DAY", 10_000, 0, 100_000_000),
                   creates_per_minute=env.integer("CREATES_PER_MINUTE", 10, 0, 1_000_000),
                   creates_per_day=env.integer("CREATES_PER_DAY", 300, 0, 100_000_000),
                   max_concurrency=env.integer("POLL_MAX_CONCURRENCY", 5, 1, 1_000))


@dataclass(frozen=True, slots=True)
class JobSettings:
    #: A job still not terminal this long after submission is recorded timed_out.
    max_age: int = 86_400
    #: A 404 this soon after submission is read-after-create lag (retried), later it is final.
    not_found_grace: int = 300
    pending_shards: int = 8

    @classmethod
    def read(cls, env: Env) -> Self:
        return cls(max_age=env.integer("JOB_MAX_AGE_SECONDS", 86_400, 60, 366 * 86_400),
                   not_found_grace=env.integer("NOT_FOUND_GRACE_SECONDS", 300, 0, 86_400),
                   pending_shards=env.integer("PENDING_SHARDS", 8, 1, 64))


@dataclass(frozen=True, slots=True)
class ScheduleSettings:
    #: Use the learned schedule once a kind has enough observations.
    learned: bool = True
    min_interval: float = 2.0
    max_interval: float = 1_800.0
    #: The interval never exceeds this fraction of the job's age (detection-delay target).
    age_fraction: float = 0.5

    @classmethod
    def read(cls, env: Env) -> Self:
        return cls(learned=env.flag("LEARNED_SCHEDULE", True),
                   min_interval=env.number("MIN_POLL_INTERVAL", 2.0, 0.1, 3_600),
                   max_interval=env.number("MAX_POLL_INTERVAL", 1_800.0, 1.0, 86_400),
                   age_fraction=env.number("POLL_AGE_FRACTION", 0.5, 0.01, 10.0))


@dataclass(frozen=True, slots=True)
class DiscoverySettings:
    """Bulk discovery (sweeps of Sume's list route): what chains do where sweeps proved coverage."""

    sweeps: bool = True
    #: Kinds whose create endpoint sends webhooks (empty: webhooks off).
    webhook_kinds: frozenset[str] = frozenset()
    #: A chain of a covered kind reads at most this often (clock seconds; never past its deadline)...
    safety: float = 900.0
    #: ... and hops this often to check that sweeps still cover its kind.
    check: float = 180.0

    @classmethod
    def read(cls, env: Env) -> Self:
        return cls(sweeps=env.flag("SWEEPS", True), webhook_kinds=_kinds(env.text("WEBHOOK_KINDS", "")),
                   safety=env.number("SWEEP_SAFETY_SECONDS", 900.0, 60.0, 86_400.0),
                   check=env.number("SWEEP_CHECK_SECONDS", 180.0, 10.0, 3_600.0))


def _kinds(raw: str) -> frozenset[str]:
    return frozenset(k.strip() for k in raw.split(",") if k.strip())


def _read_common(env: Mapping[str, str]) -> tuple[Env, Common]:
    reader = Env(env)
    return reader, Common.read(reader)


@dataclass(frozen=True, slots=True)
class PollSettings:
    common: Common
    poll_queue_url: str
    event_bus_name: str
    result_bucket: str
    sume: SumeSettings
    redis: RedisSettings
    lease: LeaseSettings
    budget: BudgetSettings
    jobs: JobSettings
    schedule: ScheduleSettings
    discovery: DiscoverySettings = DiscoverySettings()
    #: Stop starting record work when less than this much of the invocation is left (real ms).
    safety_margin_ms: int = 3_000

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        reader, common = _read_common(env)
        settings = cls(common=common, poll_queue_url=reader.text("POLL_QUEUE_URL"),
                       event_bus_name=reader.text("EVENT_BUS_NAME", "default"),
                       result_bucket=reader.text("RESULT_BUCKET"),
                       sume=SumeSettings.read(reader, common.local_endpoints),
                       redis=RedisSettings.read(reader, common.local_endpoints),
                       lease=LeaseSettings.read(reader), budget=BudgetSettings.read(reader),
                       jobs=JobSettings.read(reader), schedule=ScheduleSettings.read(reader),
                       discovery=DiscoverySettings.read(reader),
                       safety_margin_ms=reader.integer("SAFETY_MARGIN_MS", 3_000, 0, 60_000))
        timeout = settings.sume.connect_timeout_real + settings.sume.read_timeout_real
        reader.check(settings.lease.claim_ttl > timeout,
                     f"CLAIM_TTL_SECONDS must outlast one Sume request ({timeout:g} s of connect + read timeout)")
        reader.raise_problems("poll function")
        return settings


@dataclass(frozen=True, slots=True)
class FanOutSettings:
    common: Common
    poll_queue_url: str
    redis: RedisSettings
    lease: LeaseSettings
    budget: BudgetSettings
    jobs: JobSettings
    #: Clock seconds between fan-out runs (the schedule fires in real time): it starts no more
    #: chains than the read budget can serve before the next tick.
    period: float = 60.0
    safety_margin_ms: int = 3_000

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        reader, common = _read_common(env)
        settings = cls(common=common, poll_queue_url=reader.text("POLL_QUEUE_URL"),
                       redis=RedisSettings.read(reader, common.local_endpoints),
                       lease=LeaseSettings.read(reader), budget=BudgetSettings.read(reader),
                       jobs=JobSettings.read(reader),
                       period=common.clock.from_real(60 * reader.integer("FANOUT_PERIOD_MINUTES", 1, 1, 60)),
                       safety_margin_ms=reader.integer("SAFETY_MARGIN_MS", 3_000, 0, 60_000))
        reader.raise_problems("fan-out function")
        return settings


@dataclass(frozen=True, slots=True)
class SubmitSettings:
    common: Common
    poll_queue_url: str
    sume: SumeSettings
    redis: RedisSettings
    lease: LeaseSettings
    budget: BudgetSettings
    jobs: JobSettings
    schedule: ScheduleSettings
    #: Kinds whose create endpoint accepts ``webhook_url`` (empty: webhooks off).
    webhook_kinds: frozenset[str] = frozenset()
    webhook_url: str | None = None
    safety_margin_ms: int = 3_000

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        reader, common = _read_common(env)
        kinds = _kinds(reader.text("WEBHOOK_KINDS", ""))
        settings = cls(common=common, poll_queue_url=reader.text("POLL_QUEUE_URL"),
                       sume=SumeSettings.read(reader, common.local_endpoints),
                       redis=RedisSettings.read(reader, common.local_endpoints),
                       lease=LeaseSettings.read(reader), budget=BudgetSettings.read(reader),
                       jobs=JobSettings.read(reader), schedule=ScheduleSettings.read(reader),
                       webhook_kinds=kinds, webhook_url=reader.text("WEBHOOK_URL", "") or None,
                       safety_margin_ms=reader.integer("SAFETY_MARGIN_MS", 3_000, 0, 60_000))
        reader.check(not kinds or settings.webhook_url is not None, "WEBHOOK_KINDS needs WEBHOOK_URL")
        reader.raise_problems("submit function")
        return settings


@dataclass(frozen=True, slots=True)
class SweepFunctionSettings:
    common: Common
    poll_queue_url: str
    sume: SumeSettings
    redis: RedisSettings
    lease: LeaseSettings
    budget: BudgetSettings
    jobs: JobSettings
    #: Clock seconds between schedule ticks (they fire in real time; a sweep runs on a tick only
    #: while it saves reads).
    period: float = 60.0
    max_pages: int = 20
    #: How long Sume's list may lag a job's terminal status (clock seconds).
    lag: float = 60.0
    safety_margin_ms: int = 3_000

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        reader, common = _read_common(env)
        settings = cls(common=common, poll_queue_url=reader.text("POLL_QUEUE_URL"),
                       sume=SumeSettings.read(reader, common.local_endpoints),
                       redis=RedisSettings.read(reader, common.local_endpoints),
                       lease=LeaseSettings.read(reader), budget=BudgetSettings.read(reader),
                       jobs=JobSettings.read(reader),
                       period=common.clock.from_real(60.0 * reader.integer("SWEEP_PERIOD_MINUTES", 1, 1, 60)),
                       max_pages=reader.integer("SWEEP_MAX_PAGES", 20, 1, 1_000),
                       lag=reader.number("SWEEP_LAG_SECONDS", 60.0, 0.0, 3_600.0),
                       safety_margin_ms=reader.integer("SAFETY_MARGIN_MS", 3_000, 0, 60_000))
        reader.raise_problems("sweep function")
        return settings


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    common: Common
    poll_queue_url: str
    redis: RedisSettings
    lease: LeaseSettings
    jobs: JobSettings
    secret_name: str
    secret_source: str  # "ssm" | "secretsmanager"
    #: A delivery whose timestamp is further than this from now is refused (clock seconds).
    tolerance: float = 300.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        reader, common = _read_common(env)
        settings = cls(common=common, poll_queue_url=reader.text("POLL_QUEUE_URL"),
                       redis=RedisSettings.read(reader, common.local_endpoints), lease=LeaseSettings.read(reader),
                       jobs=JobSettings.read(reader), secret_name=reader.text("WEBHOOK_SECRET_NAME"),
                       secret_source=reader.choice("WEBHOOK_SECRET_SOURCE", ("ssm", "secretsmanager"),
                                                   "secretsmanager"),
                       tolerance=reader.number("WEBHOOK_TOLERANCE_SECONDS", 300.0, 1.0, 86_400.0))
        reader.raise_problems("webhook function")
        return settings
