"""The sweep function's parts: per Sume key (the list route lists one workspace), list sweeps in
that key's read-budget lane, hand-overs, and what they prove (its own coverage state)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..config.keys import KeyRing, PerKey, SumeKey
from ..discovery.coverage import CoverageStore
from ..discovery.sweep import Sweeper, SweepFunctionSettings, Sweeps
from ..limits.lease import LeaseStore
from ..limits.redisconn import ColdStartCheck
from ..store.queue import PollQueue
from ..store.records import JobStore
from . import once
from .shared import checked, key_client, read_gate, reader_ring, reads_budget, redis_check, redis_client


@once
def parts() -> tuple[SweepFunctionSettings, KeyRing, PerKey[dict[str, Any]], ColdStartCheck]:
    s = SweepFunctionSettings.from_env(os.environ)
    client, prefix = redis_client(s.redis), s.redis.key_prefix
    ring = reader_ring(s.sume, s.keys, s.budget)
    lease = LeaseStore(client, prefix)
    store, queue = JobStore(s.common.jobs_table, s.jobs.pending_shards), PollQueue(s.poll_queue_url, s.common.clock)

    def of_key(key: SumeKey) -> dict[str, Any]:
        return {"sume": key_client(s.sume, ring, key.id), "store": store, "queue": queue, "lease": lease,
                "budget": reads_budget(client, prefix, s.budget, s.common, key),
                "coverage": CoverageStore(client, key.scope(prefix)), "key": key}

    keys = PerKey(ring, of_key)
    first = keys(ring.first().id)["budget"]
    return s, ring, keys, redis_check(read_gate(lease, first, s.redis, s.budget, s.common), s.redis)


def sweeper(remaining_ms: Callable[[], int]) -> Sweeps:
    """Every key's sweep for this invocation (each key's parts are built once per container)."""
    s, ring, keys, check = parts()
    checked(check)
    return Sweeps([Sweeper(s.sweep(), s.common.clock, remaining_ms=remaining_ms, handover_ttl_real=s.lease.claim_ttl,
                           margin_real=s.lease.margin, **keys(key.id)) for key in ring.all()])
