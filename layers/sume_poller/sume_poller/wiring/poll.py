"""The poll function's parts: the SQS batch adapter over the poll state machine, one per Sume key
(each key's budget, gate, Sume client and key check; the store, queue, leases and the learned
schedule are shared)."""

from __future__ import annotations

import os
from typing import Any

from ..config.keys import PerKey, SumeKey
from ..discovery.coverage import CoverageStore, CoverageView
from ..limits.budget import Budget
from ..limits.lease import LeaseStore
from ..limits.redisconn import ColdStartCheck
from ..poll.batch import BatchRunner
from ..poll.cadence import Cadence
from ..poll.poller import Poller, PollSettings
from ..schedule.models import ModelCache
from ..store.events import EventBus
from ..store.queue import PollQueue
from ..store.records import JobStore, ResultBucket
from ..sume.client import JobReader, Refused
from . import once
from .shared import checked, key_client, read_gate, reader_ring, reads_budget, redis_check, redis_client


class RemovedKey:
    """The Sume client of a key the configuration no longer holds: every read is refused here,
    without a request (there is no key to send), so each of its jobs is recorded once - failed, or
    completed without its result when Sume had already said so - with ``key_removed``."""

    def __init__(self, key_id: str, result_max_bytes: int) -> None:
        self.result_max_bytes = result_max_bytes
        self.refusal = Refused("removed", 0, "key_removed", f"the key {key_id!r} was removed from the key "
                               "configuration while the job was pending: Sume was not asked again")

    def get_status(self, job_id: str, timeout: float | None = None) -> Refused:
        return self.refusal

    def get_result(self, job_id: str, timeout: float | None = None, **_: Any) -> Refused:
        return self.refusal

    def list_jobs(self, **_: Any) -> Refused:
        return self.refusal


@once
def parts() -> tuple[BatchRunner, ColdStartCheck]:
    s = PollSettings.from_env(os.environ)
    client, prefix, clock = redis_client(s.redis), s.redis.key_prefix, s.common.clock
    ring = reader_ring(s.sume, s.keys, s.budget)
    lease = LeaseStore(client, prefix)
    queue = PollQueue(s.poll_queue_url, clock)
    store = JobStore(s.common.jobs_table, s.jobs.pending_shards, results=ResultBucket(s.result_bucket),
                     retention_days=s.common.retention_days)
    bus, models = EventBus(s.event_bus_name), ModelCache(store, clock.now)
    result_max = s.result_max_megabytes * 1_000_000

    def poller(budget: Budget, sume: JobReader, scope: str) -> Poller:
        gate = read_gate(lease, budget, s.redis, s.budget, s.common)
        cadence = Cadence(s, models=models, rate=budget.rate,
                          coverage=CoverageView(CoverageStore(client, scope), clock.now))
        return Poller(s, gate=gate, sume=sume, store=store, bus=bus, queue=queue, cadence=cadence)

    def of_key(key: SumeKey) -> Poller:
        return poller(reads_budget(client, prefix, s.budget, s.common, key),
                      key_client(s.sume, ring, key.id, result_max_bytes=result_max), key.scope(prefix))

    def removed(key_id: str) -> Poller:  # no read is made: an unlimited budget
        return poller(Budget(client, f"{prefix}!budget:{{removed}}", 0, 0, clock.now),
                      RemovedKey(key_id, result_max), prefix)

    pollers = PerKey(ring, of_key, removed)
    probe = pollers(ring.first().id).gate  # the cold-start check runs a key's own scripts
    runner = BatchRunner(pollers, queue, safety_margin_ms=s.safety_margin_ms, default_key=ring.default_id)
    return runner, redis_check(probe, s.redis)


def runner() -> BatchRunner:
    """The batch adapter, its Redis checked."""
    batch, check = parts()
    checked(check)
    return batch
