"""The fan-out function's parts: chains restarted and outboxes finished within the read budget."""

from __future__ import annotations

import os
from collections.abc import Callable

from ..budget import Budget
from ..fanout import FanOut
from ..lease import LeaseStore
from ..queue import PollQueue
from ..redisconn import ColdStartCheck
from ..settings import FanOutSettings
from ..store import JobStore
from . import checked, once, read_gate, reads_budget, redis_check, redis_client


@once
def parts() -> tuple[FanOutSettings, JobStore, PollQueue, LeaseStore, ColdStartCheck, Budget]:
    s = FanOutSettings.from_env(os.environ)
    client = redis_client(s.redis)
    lease = LeaseStore(client, s.redis.key_prefix)
    budget = reads_budget(client, s.redis.key_prefix, s.budget, s.common)
    gate = read_gate(lease, budget, s.redis, s.budget, s.common)
    return (s, JobStore(s.common.jobs_table, s.jobs.pending_shards), PollQueue(s.poll_queue_url, s.common.clock),
            lease, redis_check(gate, s.redis), budget)


def fanout(remaining_ms: Callable[[], int]) -> FanOut:
    """A fan-out run for one invocation (its parts are built once per container)."""
    s, store, queue, lease, check, budget = parts()
    checked(check)
    return FanOut(s, store, queue, lease, budget, remaining_ms)
