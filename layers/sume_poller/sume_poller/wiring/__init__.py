"""Per-container wiring, one module per function: each builds that function's parts once, on
first use, from its settings (read and validated there, at cold start), and imports only what the
function runs - the poll function never loads sweep, webhook or submit code, fan-out never loads
the schedule model.

What they share is here: the Redis client (one per container), the cold-start check of it
(:class:`~sume_poller.redisconn.ColdStartCheck`: a misconfigured Redis fails the invocation
loudly, counted as ``RedisMisconfigured``; an unreachable one is an outage the parts ride out),
the shared read budget and the Sume client. :func:`reset` forgets every part of every loaded
function module (local runs and tests change the environment between cases).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

from ..budget import Budget, LocalPacer
from ..gate import ReadGate
from ..lease import LeaseStore
from ..observability import MetricUnit, metrics
from ..redisconn import ColdStartCheck, RedisMisconfigured, connect
from ..settings import BudgetSettings, Common, RedisSettings, SumeSettings

F = TypeVar("F", bound=Callable[..., Any])


def once(builder: F) -> F:
    """Build once per container (``functools.cache``), forgotten by :func:`reset`."""
    cached: Any = cache(builder)
    _built.append(cached)
    return cached  # type: ignore[no-any-return]


_built: list[Any] = []


@once
def redis_client(settings: RedisSettings) -> Any:
    return connect(settings)


def reads_budget(client: Any, prefix: str, budget: BudgetSettings, common: Common) -> Budget:
    clock = common.clock
    return Budget(client, f"{prefix}!budget:{{reads}}", budget.reads_per_minute, budget.reads_per_day, clock.now,
                  early=clock.from_real(0.5), real_per_clock=clock.scale, reserve_every=budget.reserve_every)


def read_gate(lease: LeaseStore, budget: Budget, settings: RedisSettings, budgets: BudgetSettings,
              common: Common) -> ReadGate:
    """The gate before a read, with this container's outage pacer (its share of the limits)."""
    pacer = LocalPacer(budget.per_minute, budget.per_day, budgets.max_concurrency, common.clock.now)
    return ReadGate(lease, budget, pacer, cluster=settings.mode == "cluster")


def sume_client(settings: SumeSettings, **options: Any) -> Any:
    from ..credentials import Secret
    from ..sume import SumeClient

    key = Secret(settings.api_key_name, settings.api_key_source)
    return SumeClient(settings.base_url, key, connect_timeout=settings.connect_timeout_real,
                      read_timeout=settings.read_timeout_real, on_key_rejected=key.invalidate, **options)


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


def reset() -> None:
    """Forget every part, setting and cached secret of every loaded function module (the boto3
    clients follow the environment themselves, see :func:`sume_poller.aws.client`)."""
    for cached in _built:
        cached.cache_clear()
