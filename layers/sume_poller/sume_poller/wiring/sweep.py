"""The sweep function's parts: list sweeps in the read budget's lane, hand-overs, coverage."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..coverage import CoverageStore
from ..lease import LeaseStore
from ..queue import PollQueue
from ..redisconn import ColdStartCheck
from ..settings import SweepFunctionSettings
from ..store import JobStore
from ..sweep import Sweeper, SweepSettings
from . import checked, once, read_gate, reads_budget, redis_check, redis_client, sume_client


@once
def parts() -> tuple[SweepFunctionSettings, dict[str, Any], ColdStartCheck]:
    s = SweepFunctionSettings.from_env(os.environ)
    client = redis_client(s.redis)
    lease = LeaseStore(client, s.redis.key_prefix)
    budget = reads_budget(client, s.redis.key_prefix, s.budget, s.common)
    check = redis_check(read_gate(lease, budget, s.redis, s.budget, s.common), s.redis)
    return s, {"sume": sume_client(s.sume), "store": JobStore(s.common.jobs_table, s.jobs.pending_shards),
               "queue": PollQueue(s.poll_queue_url, s.common.clock), "lease": lease, "budget": budget,
               "coverage": CoverageStore(client, s.redis.key_prefix)}, check


def sweeper(remaining_ms: Callable[[], int]) -> Sweeper:
    """A sweep for one invocation (its parts are built once per container)."""
    s, sweep_parts, check = parts()
    checked(check)
    return Sweeper(SweepSettings(s.period, s.max_pages, s.lag, s.safety_margin_ms, s.read_share / 100,
                                 max_age=float(s.jobs.max_age)),
                   s.common.clock, remaining_ms=remaining_ms, handover_ttl_real=s.lease.claim_ttl,
                   margin_real=s.lease.margin, **sweep_parts)
