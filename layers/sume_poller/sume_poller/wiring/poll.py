"""The poll function's parts: the SQS batch adapter over the poll state machine."""

from __future__ import annotations

import os

from ..batch import BatchRunner
from ..cadence import Cadence
from ..coverage import CoverageStore, CoverageView
from ..events import EventBus
from ..lease import LeaseStore
from ..models import ModelCache
from ..poller import Poller
from ..queue import PollQueue
from ..redisconn import ColdStartCheck
from ..settings import PollSettings
from ..store import JobStore, ResultBucket
from . import checked, once, read_gate, reads_budget, redis_check, redis_client, sume_client


@once
def parts() -> tuple[BatchRunner, ColdStartCheck]:
    s = PollSettings.from_env(os.environ)
    client = redis_client(s.redis)
    budget = reads_budget(client, s.redis.key_prefix, s.budget, s.common)
    gate = read_gate(LeaseStore(client, s.redis.key_prefix), budget, s.redis, s.budget, s.common)
    queue = PollQueue(s.poll_queue_url, s.common.clock)
    store = JobStore(s.common.jobs_table, s.jobs.pending_shards, results=ResultBucket(s.result_bucket))
    cadence = Cadence(s, models=ModelCache(store, s.common.clock.now), rate=budget.rate,
                      coverage=CoverageView(CoverageStore(client, s.redis.key_prefix), s.common.clock.now))
    poller = Poller(s, gate=gate, sume=sume_client(s.sume, result_max_bytes=s.result_max_megabytes * 1_000_000),
                    store=store, bus=EventBus(s.event_bus_name), queue=queue, cadence=cadence)
    return BatchRunner(poller, queue, safety_margin_ms=s.safety_margin_ms), redis_check(gate, s.redis)


def runner() -> BatchRunner:
    """The batch adapter, its Redis checked."""
    batch, check = parts()
    checked(check)
    return batch
