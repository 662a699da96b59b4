"""The submit function's parts: the paid create with its Idempotency-Key, the job's first step;
per Sume key, its client and create budget."""

from __future__ import annotations

import os

from ..budget import LocalPacer
from ..keys import PerKey, SumeKey
from ..lease import LeaseStore
from ..models import ModelCache
from ..queue import PollQueue
from ..redisconn import ColdStartCheck
from ..settings import SubmitSettings
from ..store import JobStore
from ..submit import SubmitKey, Submitter
from . import budget_of, checked, key_client, once, read_gate, reader_ring, redis_check, redis_client


@once
def parts() -> tuple[Submitter, ColdStartCheck]:
    s = SubmitSettings.from_env(os.environ)
    client, prefix, clock = redis_client(s.redis), s.redis.key_prefix, s.common.clock
    ring = reader_ring(s.sume, s.keys, s.budget)
    lease = LeaseStore(client, prefix)
    store = JobStore(s.common.jobs_table, s.jobs.pending_shards)

    def of_key(key: SumeKey) -> SubmitKey:
        creates = budget_of(client, prefix, key, "creates", s.common)
        pacer = LocalPacer(key.limits.creates_per_minute, key.limits.creates_per_day, s.budget.max_concurrency,
                           clock.now)
        return SubmitKey(key, key_client(s.sume, ring, key.id), creates, pacer)

    keys = PerKey(ring, of_key)
    submitter = Submitter(s, keys=keys, store=store, queue=PollQueue(s.poll_queue_url, clock), lease=lease,
                          models=ModelCache(store, clock.now))
    first = keys(ring.first().id)  # the cold-start check runs a key's own scripts
    return submitter, redis_check(read_gate(lease, first.creates, s.redis, s.budget, s.common), s.redis)


def submitter() -> Submitter:
    submit, check = parts()
    checked(check)
    return submit
