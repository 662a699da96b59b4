"""Settings: read once per container from the environment, validated, frozen.

Each function gets the settings it reads, a :class:`FunctionSettings` built from small groups
(:class:`SumeSettings`, :class:`RedisSettings`, ...) and defined beside the code that reads it
(``PollSettings`` in :mod:`sume_poller.poll.poller`, ``FanOutSettings`` in :mod:`sume_poller.poll.fanout`,
``SubmitSettings`` in :mod:`sume_poller.creates.submit`, ``SweepFunctionSettings`` in
:mod:`sume_poller.discovery.sweep`, ``WebhookSettings`` in :mod:`sume_poller.discovery.webhook`): a
function's cold start creates its own settings classes only (each settings class, a
:func:`~sume_poller.core.values.value`, costs about 0.1 ms of CPU to create on Python 3.13, bench
figure 4). A field names its variable,
default and bounds once, with :func:`setting`. ``template.yaml`` sets the variables; a missing or
bad value fails the cold start with :class:`ConfigError`, which lists every problem, one line
each, naming the variable - instead of failing later on the first message that needs it.

Times are clock seconds (see :mod:`sume_poller.core.clock`) unless a name or docstring says real:
socket timeouts and the lease's margins (processing and queueing lag) are spent in real time
whatever ``TIME_SCALE`` says.

Why no settings library: Powertools' parser or aws-lambda-env-modeler would replace ``Env``,
:func:`setting` and :func:`declared` (about 100 lines) with pydantic models, and pydantic costs
every cold start of every function. Measured in fresh interpreters that already hold Powertools'
Logger and Metrics, the poll function's settings imported, declared and read (CPU time, median
of 9; pydantic 2.14, Powertools 3.37, env-modeler 3.0, Python 3.11): this module 15 ms compiled
from source (11 ms from .pyc), Powertools' parser 224 ms (75 ms), aws-lambda-env-modeler 207 ms
(71 ms) - over a third of the cold-start floor of bench figure 4 then (about 580 ms), plus about
10 MB of pydantic and pydantic-core in the layer.
"""

from __future__ import annotations

import inspect
import ipaddress
import sys
from collections.abc import Callable, Mapping
from dataclasses import field, fields
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit

from ..core.clock import Clock
from ..core.jobs import valid_key_id
from ..core.values import value

#: template.yaml's PollQueue VisibilityTimeout and PollFunction Timeout. A claim on a job's lease
#: must expire before SQS delivers a message whose poller crashed again: the claim may be taken as
#: late as the end of the function's timeout, and the message comes back at the visibility
#: timeout. So CLAIM_TTL_SECONDS is at most their difference (the template's ClaimTtlSeconds
#: MaxValue; tests/unit/test_template_real_account.py ties the three together).
POLL_QUEUE_VISIBILITY_TIMEOUT_SECONDS = 180
POLL_FUNCTION_TIMEOUT_SECONDS = 30
CLAIM_TTL_MAX_SECONDS = POLL_QUEUE_VISIBILITY_TIMEOUT_SECONDS - POLL_FUNCTION_TIMEOUT_SECONDS

#: The largest result the poll function keeps (template.yaml's ResultMaxMegabytes MaxValue): what
#: it can stream from Sume to S3 within its timeout. A result read without the time for it is
#: re-queued to a fresh invocation (the poller's out_of_time and result_not_stored), which has the
#: 30 s less the batch's 3 s safety margin and 3 s after the read (the terminal write): 24 s, of
#: which 20 are the stream's (the rest: connecting, the first byte). 5 MB/s per container is a
#: stated, conservative throughput for Sume to Lambda to S3 (loopback measures nothing of it),
#: shared by the container's upload streams at once (store.UPLOAD_STREAMS): 20 x 5 / 2 = 50 MB.
RESULT_STREAM_SECONDS = 20
RESULT_STREAM_MB_PER_SECOND = 5
RESULT_UPLOAD_STREAMS = 2
RESULT_MAX_MEGABYTES_MAX = RESULT_STREAM_SECONDS * RESULT_STREAM_MB_PER_SECOND // RESULT_UPLOAD_STREAMS

#: The most days RETENTION_DAYS (template.yaml's RetentionDays) keeps a finished job.
RETENTION_DAYS_MAX = 3650

#: A Redis host ending so is ElastiCache, reachable only from inside its VPC.
ELASTICACHE_HOST_SUFFIX = ".cache.amazonaws.com"


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
        return int(self._bounded(name, default, low, high, int, "an integer"))

    def number(self, name: str, default: float, low: float, high: float) -> float:
        return self._bounded(name, default, low, high, float, "a number")

    def _bounded(self, name: str, default: float, low: float, high: float, parse: Callable[[str], float],
                 what: str) -> float:
        raw = self._env.get(name, "").strip()
        if not raw:
            return default
        try:
            value = parse(raw)
        except ValueError:
            self.problems.append(f"{name} must be {what}, not {raw!r}")
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


#: The default of a :func:`setting` that must be set.
REQUIRED = object()


def setting(var: str, default: Any = REQUIRED, low: float | None = None, high: float | None = None) -> Any:
    """A settings field read from the environment variable ``var``. Its default gives its type
    (bool, int, float or str; :data:`REQUIRED`: a string that must be set), numbers their
    inclusive bounds. The default is written once, here."""
    return field(default="" if default is REQUIRED else default,
                 metadata={"var": var, "required": default is REQUIRED, "low": low, "high": high})


def schedule_period(var: str) -> Any:
    """A field for a schedule's period: ``var`` holds whole real minutes (1-60); the field is in
    clock seconds (a compressed clock fires the real-time schedule more often in clock time)."""
    return field(default=60.0, metadata={"period": var})


def default(cls: type[Any], name: str) -> Any:
    """The default field ``name`` of settings class ``cls`` declares (where another class keeps the
    value without reading it from the environment)."""
    return next(f.default for f in fields(cls) if f.name == name)


def declared(cls: type[Any], env: Env) -> dict[str, Any]:
    """The values of ``cls``'s fields declared with :func:`setting`, read from ``env``."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        if "var" not in f.metadata:
            continue
        var, low, high, default = f.metadata["var"], f.metadata["low"], f.metadata["high"], f.default
        if f.metadata["required"]:
            values[f.name] = env.text(var)
        elif isinstance(default, bool):
            values[f.name] = env.flag(var, default)
        elif isinstance(default, int):
            values[f.name] = env.integer(var, default, int(low), int(high))
        elif isinstance(default, float):
            values[f.name] = env.number(var, default, float(low), float(high))
        else:
            values[f.name] = env.text(var, str(default))
    return values


class Group:
    """A group of settings several functions share; ``read`` reads it from the environment."""

    __slots__ = ()

    @classmethod
    def read(cls, env: Env, common: Common) -> Self:
        return cls(**declared(cls, env))


def groups(cls: type) -> dict[str, type[Group]]:
    """The fields of ``cls`` (and its bases) annotated with a :class:`Group`, each with its group:
    what ``typing.get_type_hints`` resolves them to, found by looking up only the annotations that
    are a plain name (as a group's is) - in the class that declares the field, then its module -
    where ``get_type_hints`` compiles and evaluates every annotation of the class and its bases
    (about 2.5 M instructions of a function's cold start, bench figure 4)."""
    found: dict[str, type[Group]] = {}
    for base in reversed(cls.__mro__):
        module = vars(sys.modules[base.__module__]) if base.__module__ in sys.modules else {}
        for name, annotation in inspect.get_annotations(base).items():
            hint = annotation
            if isinstance(annotation, str):
                hint = base.__dict__.get(annotation, module.get(annotation)) if annotation.isidentifier() else None
            if isinstance(hint, type) and issubclass(hint, Group):
                found[name] = hint
            else:
                found.pop(name, None)
    return found


@value
class Common:
    """What every function reads: the job table, the (compressible) clock, whether endpoints may be local."""

    jobs_table: str
    clock: Clock
    #: Set only for local emulators: allows http:// Sume and a loopback Redis.
    local_endpoints: bool
    #: Days a finished job's record is kept once its outbox is done (0: forever; a DynamoDB TTL).
    retention_days: int = 0

    @classmethod
    def read(cls, env: Env) -> Self:
        scale = env.number("TIME_SCALE", 1.0, 0.0001, 1.0)
        local = env.flag("LOCAL_ENDPOINTS", False)
        env.check(scale == 1.0 or local,
                  f"TIME_SCALE {scale:g} compresses the clock: only with LOCAL_ENDPOINTS=true (on AWS it is 1)")
        return cls(jobs_table=env.text("JOBS_TABLE"), clock=Clock(scale), local_endpoints=local,
                   retention_days=env.integer("RETENTION_DAYS", 0, 0, RETENTION_DAYS_MAX))


@value
class SumeSettings(Group):
    """Sume's base URL, where the default key's API key is kept, and the socket timeouts (real seconds)."""

    base_url: str
    api_key_name: str
    api_key_source: str  # "ssm" | "secretsmanager"
    connect_timeout_real: float = setting("SUME_CONNECT_TIMEOUT", 3.0, 0.05, 30.0)
    read_timeout_real: float = setting("SUME_READ_TIMEOUT", 10.0, 0.05, 60.0)

    @classmethod
    def read(cls, env: Env, common: Common) -> Self:
        base = env.text("SUME_BASE_URL").rstrip("/")
        parts = urlsplit(base)
        env.check(not base or parts.scheme == "https" or (parts.scheme == "http" and common.local_endpoints),
                  f"SUME_BASE_URL must be an https URL (http only with LOCAL_ENDPOINTS=true), not {base!r}")
        return cls(base_url=base, api_key_name=env.text("SUME_API_KEY_NAME", ""),
                   api_key_source=env.choice("SUME_API_KEY_SOURCE", ("ssm", "secretsmanager"), "ssm"),
                   **declared(cls, env))


@value
class KeySettings(Group):
    """The Sume keys a deployment serves (:mod:`sume_poller.config.keys`): the default key's id (jobs and
    events that name no key) and the key configuration's Secrets Manager secret, if any."""

    default_id: str = "default"
    config_secret: str | None = None
    #: Real seconds the key configuration is reused before it is read again (a 401 reads it at once).
    max_age: float = setting("SUME_KEYS_MAX_AGE", 60.0, 1.0, 3_600.0)

    @classmethod
    def read(cls, env: Env, common: Common) -> Self:
        default_id = env.text("DEFAULT_KEY_ID", "default")
        env.check(valid_key_id(default_id),
                  f"DEFAULT_KEY_ID must be 1-32 letters, digits, '_' or '-', not {default_id[:40]!r}")
        return cls(default_id=default_id, config_secret=env.text("SUME_KEYS_SECRET_NAME", "") or None,
                   **declared(cls, env))


@value
class RedisSettings(Group):
    """The Redis endpoint, its mode, its credentials' secret, the key prefix and the socket timeout."""

    url: str
    mode: str  # "standalone" | "cluster"
    #: Secrets Manager secret with {"username": ..., "password": ...} (ElastiCache RBAC); optional.
    secret_name: str | None
    key_prefix: str = "sume:poll:"
    timeout_real: float = setting("REDIS_TIMEOUT", 1.0, 0.05, 10.0)

    @classmethod
    def read(cls, env: Env, common: Common) -> Self:
        url = env.text("REDIS_URL")
        parts = urlsplit(url)
        env.check(not url or parts.scheme in ("redis", "rediss"),
                  "REDIS_URL must start with redis:// or rediss://")
        env.check(parts.password is None and parts.username is None,
                  "REDIS_URL must not carry credentials: put them in the secret named by REDIS_SECRET_NAME")
        env.check(not url or common.local_endpoints or not is_loopback(parts.hostname),
                  f"REDIS_URL points at {parts.hostname}: a loopback Redis is only valid with LOCAL_ENDPOINTS=true")
        elasticache = (parts.hostname or "").lower().endswith(ELASTICACHE_HOST_SUFFIX)
        env.check(not elasticache or common.local_endpoints or env.flag("IN_VPC", False),
                  f"REDIS_URL points at {parts.hostname}: ElastiCache is reachable only inside its VPC: "
                  "set SubnetIds and SecurityGroupIds (IN_VPC is not true)")
        prefix = env.text("LEASE_KEY_PREFIX", "sume:poll:")
        env.check(len(prefix) <= 64 and "{" not in prefix and "}" not in prefix,
                  "LEASE_KEY_PREFIX must be at most 64 characters without braces")
        return cls(url=url, mode=env.choice("REDIS_MODE", ("standalone", "cluster"), "standalone"),
                   secret_name=env.text("REDIS_SECRET_NAME", "") or None, key_prefix=prefix, **declared(cls, env))


@value
class LeaseSettings(Group):
    """Real seconds: they cover processing and queueing lag, which a compressed clock does not shorten."""

    #: Lease time beyond each re-queue delay (SQS and Lambda lag, including a queue backlog).
    margin: int = setting("LEASE_MARGIN_SECONDS", 120, 1, 3_600)
    #: Lease time while one message is processed (longer than the poll function's timeout, at
    #: most :data:`CLAIM_TTL_MAX_SECONDS`).
    claim_ttl: int = setting("CLAIM_TTL_SECONDS", 60, 1, CLAIM_TTL_MAX_SECONDS)
    #: Lease time of a chain that submit or fan-out just started: how long its first message
    #: may wait in the queue before a fan-out tick may start another chain for the job.
    start_ttl: int = setting("START_LEASE_SECONDS", 600, 1, 86_400)


def safety_cadence() -> Any:
    """The safety cadence (``SWEEP_SAFETY_SECONDS``, clock seconds): how often a chain of a kind that
    bulk discovery covers still reads; the budget keeps a day's reserve by it. One variable, read
    into each group that needs it."""
    return setting("SWEEP_SAFETY_SECONDS", 900.0, 60.0, 86_400.0)


#: The default of ``SAFETY_MARGIN_MS`` (real milliseconds).
SAFETY_MARGIN_MS = 3_000


def safety_margin() -> Any:
    """``SAFETY_MARGIN_MS``: a function stops starting work when less than this much of its
    invocation is left (real ms). One variable, read by each function that needs it."""
    return setting("SAFETY_MARGIN_MS", SAFETY_MARGIN_MS, 0, 60_000)


@value
class BudgetSettings(Group):
    """Sume's per-key budgets (0 = not limited here). Defaults: Sume's documented numbers."""

    reads_per_minute: int = setting("READS_PER_MINUTE", 120, 0, 1_000_000)
    reads_per_day: int = setting("READS_PER_DAY", 10_000, 0, 100_000_000)
    creates_per_minute: int = setting("CREATES_PER_MINUTE", 10, 0, 1_000_000)
    creates_per_day: int = setting("CREATES_PER_DAY", 300, 0, 100_000_000)
    #: Poll invocations that may run at once: the local pacing while Redis is down divides the
    #: budget by it, so every container together stays inside the budget.
    max_concurrency: int = setting("POLL_MAX_CONCURRENCY", 5, 1, 1_000)
    #: The day's reserve: one read per pending job per safety cadence (of chains where bulk discovery
    #: covers their kind) is kept for the rest of the day.
    reserve_every: float = safety_cadence()


@value
class JobSettings(Group):
    """How long a job may stay pending, how long a 404 is read-after-create lag, the pending shards."""

    #: A job still not terminal this long after submission is recorded timed_out.
    max_age: int = setting("JOB_MAX_AGE_SECONDS", 86_400, 60, 366 * 86_400)
    #: A 404 this soon after submission is read-after-create lag (retried), later it is final.
    not_found_grace: int = setting("NOT_FOUND_GRACE_SECONDS", 300, 0, 86_400)
    #: How long per-job reads refused with a status the contract does not name for them (a 4xx but
    #: 401/403/404 on the job; a result refused after the status said completed) are retried before
    #: the refusal is recorded (clock seconds).
    refusal_window: int = setting("REFUSAL_WINDOW_SECONDS", 3_600, 300, 86_400)
    pending_shards: int = setting("PENDING_SHARDS", 8, 1, 64)


@value
class ScheduleSettings(Group):
    """The read schedule: learned once a kind has enough observations, within these bounds."""

    #: Use the learned schedule once a kind has enough observations.
    learned: bool = setting("LEARNED_SCHEDULE", True)
    min_interval: float = setting("MIN_POLL_INTERVAL", 2.0, 0.1, 3_600)
    max_interval: float = setting("MAX_POLL_INTERVAL", 1_800.0, 1.0, 86_400)
    #: The interval never exceeds this fraction of the job's age (detection-delay target).
    age_fraction: float = setting("POLL_AGE_FRACTION", 0.5, 0.01, 10.0)


@value
class DiscoverySettings(Group):
    """Bulk discovery (sweeps of Sume's list route): what chains do where sweeps proved coverage."""

    sweeps: bool = setting("SWEEPS", True)
    #: Kinds whose create endpoint sends webhooks (empty: webhooks off).
    webhook_kinds: frozenset[str] = frozenset()
    #: A chain of a covered kind reads at most this often (clock seconds; never past its deadline)...
    safety: float = safety_cadence()
    #: ... and hops this often to check that sweeps still cover its kind.
    check: float = setting("SWEEP_CHECK_SECONDS", 180.0, 10.0, 3_600.0)

    @classmethod
    def read(cls, env: Env, common: Common) -> Self:
        return cls(webhook_kinds=kinds_of(env.text("WEBHOOK_KINDS", "")), **declared(cls, env))


def kinds_of(raw: str) -> frozenset[str]:
    """The kinds named in a comma-separated list (``WEBHOOK_KINDS``)."""
    return frozenset(k.strip() for k in raw.split(",") if k.strip())


@value(kw_only=True)
class FunctionSettings:
    """What one function reads: ``common``, its :class:`Group` fields (each read by its group),
    its fields declared with :func:`setting`, and what :meth:`read_own` adds. Validated once, at
    cold start: :meth:`from_env` raises :class:`ConfigError` listing every problem. Every
    function re-queues poll messages and touches leases, so these fields are everyone's."""

    what: ClassVar[str]
    common: Common
    poll_queue_url: str = setting("POLL_QUEUE_URL")
    redis: RedisSettings
    lease: LeaseSettings
    jobs: JobSettings
    keys: KeySettings

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        reader = Env(env)
        common = Common.read(reader)
        grouped = groups(cls)
        values: dict[str, Any] = {"common": common, **declared(cls, reader), **cls.read_own(reader, common)}
        for f in fields(cls):
            group = grouped.get(f.name)
            if group is not None:
                values[f.name] = group.read(reader, common)
            elif "period" in f.metadata:
                values[f.name] = common.clock.from_real(60.0 * reader.integer(f.metadata["period"], 1, 1, 60))
        settings = cls(**values)
        settings.check(reader)
        reader.raise_problems(cls.what)
        return settings

    @classmethod
    def read_own(cls, env: Env, common: Common) -> dict[str, Any]:
        """Values that need more than :func:`setting` (the clock, several variables)."""
        return {}

    def check(self, env: Env) -> None:
        """Checks across fields: add problems to ``env``."""


@value(kw_only=True)
class SumeReaderSettings(FunctionSettings):
    """The functions that call Sume: its client and the shared budget."""

    sume: SumeSettings
    budget: BudgetSettings
    #: Stop starting work when less than this much of the invocation is left (real ms).
    safety_margin_ms: int = safety_margin()

    def check(self, env: Env) -> None:
        env.check(bool(self.sume.api_key_name or self.keys.config_secret),
                  "SUME_API_KEY_NAME (the default key) or SUME_KEYS_SECRET_NAME (the key configuration) is required")
