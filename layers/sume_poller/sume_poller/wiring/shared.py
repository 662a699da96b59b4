"""What the functions that talk to Redis and Sume share: the Redis client (one per container),
the cold-start check of it (:class:`~sume_poller.limits.redisconn.ColdStartCheck`: a misconfigured Redis
fails the invocation loudly, counted as ``RedisMisconfigured``; an unreachable one is an outage the
parts ride out), the Sume keys (:func:`key_ring`: the default key from the function's settings, the
others from the key configuration), each key's budgets and Sume client.
"""

from __future__ import annotations

from typing import Any

from ..config.keys import KeyConfigError, KeyRing, Limits, SumeKey
from ..config.settings import BudgetSettings, Common, KeySettings, RedisSettings, SumeSettings
from ..core.observability import MetricUnit, metrics
from ..limits.budget import Budget
from ..limits.gate import ReadGate
from ..limits.lease import LeaseStore
from ..limits.pacer import LocalPacer
from ..limits.redisconn import ColdStartCheck, RedisMisconfigured, connect
from . import once


@once
def redis_client(settings: RedisSettings) -> Any:
    return connect(settings)


def limits(budget: BudgetSettings) -> Limits:
    """The deployment's budget parameters: the default key's limits, and every key's defaults."""
    return Limits(budget.reads_per_minute, budget.reads_per_day, budget.creates_per_minute, budget.creates_per_day)


@once
def key_ring(keys: KeySettings, defaults: Limits, api_key: tuple[str, str] | None = None,
             webhook_secret: tuple[str, str] | None = None, *, default: bool = True) -> KeyRing:
    """The Sume keys this container serves: the default key (when ``default``) with what the
    function holds of it (its API key and/or webhook secret, each ``(name, "ssm" |
    "secretsmanager")``), the others from the key configuration (see :mod:`sume_poller.config.keys`)."""
    from ..config.credentials import Secret

    if default:
        own: SumeKey | None = SumeKey(keys.default_id, defaults, Secret(*api_key) if api_key else _no_api_key,
                                      Secret(*webhook_secret) if webhook_secret else None, default=True)
    else:
        own = None
    if not keys.config_secret:
        return KeyRing(keys.default_id, own, defaults=defaults)
    config = Secret(keys.config_secret, "secretsmanager", max_age=keys.max_age)

    def read_config(force: bool) -> str:
        """The key list's text; a list that does not exist (yet) is a configuration error the ring counts
        (KeyConfigInvalid, alarmed) and, with no list read before, fails the call: serving the default key
        alone would record every other key's jobs failed (key_removed)."""
        from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError

        if force:
            config.invalidate()
        try:
            return config()
        except GetParameterError as exc:
            if "ResourceNotFoundException" not in str(exc):
                raise
            raise KeyConfigError(f"the key configuration {keys.config_secret} does not exist: create that Secrets "
                                 'Manager secret ({"keys": {}} while there are no keys) or deploy with '
                                 "SumeKeysSecretName empty") from None

    return KeyRing(keys.default_id, own, read_config=read_config, secret=Secret, defaults=defaults,
                   config_name=keys.config_secret, max_age=keys.max_age)


def _no_api_key() -> str:
    raise LookupError("this function holds no Sume API key")


def budget_of(client: Any, prefix: str, key: SumeKey, what: str, common: Common, reserve_every: float = 0.0) -> Budget:
    """A key's ``what`` budget ("reads" or "creates") under its own Redis key."""
    clock, lim = common.clock, key.limits
    per_minute, per_day = ((lim.reads_per_minute, lim.reads_per_day) if what == "reads"
                           else (lim.creates_per_minute, lim.creates_per_day))
    return Budget(client, key.budget_name(prefix, what), per_minute, per_day, clock.now, early=clock.from_real(0.5),
                  real_per_clock=clock.scale, reserve_every=reserve_every)


def reads_budget(client: Any, prefix: str, budget: BudgetSettings, common: Common,
                 key: SumeKey | None = None) -> Budget:
    """A key's read budget (the default key's, with the deployment's limits, when ``key`` is None)."""
    key = key or SumeKey("default", limits(budget), _no_api_key, default=True)
    return budget_of(client, prefix, key, "reads", common, budget.reserve_every)


def read_gate(lease: LeaseStore, budget: Budget, settings: RedisSettings, budgets: BudgetSettings,
              common: Common) -> ReadGate:
    """The gate before a read, with this container's outage pacer (its share of the limits)."""
    pacer = LocalPacer(budget.per_minute, budget.per_day, budgets.max_concurrency, common.clock.now)
    return ReadGate(lease, budget, pacer, cluster=settings.mode == "cluster")


def sume_client(settings: SumeSettings, **options: Any) -> Any:
    """A client of the deployment's one key (``SUME_API_KEY_NAME``)."""
    from ..config.credentials import Secret
    from ..sume.client import SumeClient

    key = Secret(settings.api_key_name, settings.api_key_source)
    return SumeClient(settings.base_url, key, connect_timeout=settings.connect_timeout_real,
                      read_timeout=settings.read_timeout_real, on_key_rejected=key.invalidate, **options)


def key_client(settings: SumeSettings, ring: KeyRing, key_id: str, **options: Any) -> Any:
    """A client of one key: every request asks the ring for the key's current value (a rotated
    key is picked up within the ring's cache, at once after a 401)."""
    from ..sume.client import SumeClient

    return SumeClient(settings.base_url, lambda: ring.get(key_id).api_key(),
                      connect_timeout=settings.connect_timeout_real, read_timeout=settings.read_timeout_real,
                      on_key_rejected=ring.invalidate, **options)


def reader_ring(sume: SumeSettings, keys: KeySettings, budget: BudgetSettings) -> KeyRing:
    """The key ring of a function that calls Sume (its default key: ``SUME_API_KEY_NAME``)."""
    api_key = (sume.api_key_name, sume.api_key_source) if sume.api_key_name else None
    return key_ring(keys, limits(budget), api_key, default=api_key is not None)


def redis_check(gate: ReadGate, settings: RedisSettings) -> ColdStartCheck:
    """The cold-start check of a function's Redis: the gate's scripts on the probe key."""
    return ColdStartCheck(gate.lease.client, settings.mode, gate.probe)


def checked(check: ColdStartCheck) -> None:
    """Run the cold-start check until it passes once; a misconfiguration raises, counted."""
    try:
        check()
    except RedisMisconfigured:
        metrics.add_metric(name="RedisMisconfigured", unit=MetricUnit.Count, value=1)
        raise
