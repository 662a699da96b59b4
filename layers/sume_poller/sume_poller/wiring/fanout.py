"""The fan-out function's parts: chains restarted and outboxes finished, each key's within its
read budget (a lane per key: the configured ones, and those the table still has jobs of)."""

from __future__ import annotations

import os
from collections.abc import Callable

from ..config.keys import KeyRing
from ..limits.budget import Budget
from ..limits.lease import LeaseStore
from ..limits.redisconn import ColdStartCheck
from ..poll.fanout import FanOut, FanOutSettings, Lane
from ..store.queue import PollQueue
from ..store.records import JobStore
from . import once
from .shared import budget_of, checked, key_ring, limits, read_gate, redis_check, redis_client


@once
def parts() -> tuple[FanOutSettings, JobStore, PollQueue, LeaseStore, KeyRing, ColdStartCheck]:
    s = FanOutSettings.from_env(os.environ)
    client = redis_client(s.redis)
    lease = LeaseStore(client, s.redis.key_prefix)
    ring = key_ring(s.keys, limits(s.budget))  # fan-out reads the default key's partitions whatever it holds
    probe = budget_of(client, s.redis.key_prefix, ring.first(), "reads", s.common, s.budget.reserve_every)
    store = JobStore(s.common.jobs_table, s.jobs.pending_shards, retention_days=s.common.retention_days)
    return (s, store, PollQueue(s.poll_queue_url, s.common.clock),
            lease, ring, redis_check(read_gate(lease, probe, s.redis, s.budget, s.common), s.redis))


def lanes(s: FanOutSettings, store: JobStore, lease: LeaseStore, ring: KeyRing) -> list[Lane]:
    """A lane per configured key, and one (unlimited: no read is made) per key the table has
    recorded jobs of that the configuration no longer holds."""
    prefix, configured = s.redis.key_prefix, ring.all()
    out = [Lane(k.id, budget_of(lease.client, prefix, k, "reads", s.common, s.budget.reserve_every), k.scope(prefix),
                named=not k.default) for k in configured]
    for gone in sorted(store.known_keys() - {k.id for k in configured} - {ring.default_id}):
        out.append(Lane(gone, Budget(lease.client, f"{prefix}!budget:{{removed}}", 0, 0, s.common.clock.now),
                        f"{prefix}@{gone}:", named=True))
    return out


def fanout(remaining_ms: Callable[[], int]) -> FanOut:
    """A fan-out run for one invocation (its parts are built once per container)."""
    s, store, queue, lease, ring, check = parts()
    checked(check)
    create_queue = PollQueue(s.create_queue_url, s.common.clock) if s.create_queue_url else None
    return FanOut(s, store, queue, lease, None, remaining_ms, lanes=lanes(s, store, lease, ring),
                  create_queue=create_queue)
