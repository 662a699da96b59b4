"""The submit function's parts: the paid create with its Idempotency-Key, the job's first step,
the create queue's drain steps; per Sume key, its client and create budget."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config.keys import PerKey, SumeKey
from ..creates.submit import SubmitKey, SubmitSettings, Submitter
from ..limits.budget import NO_DAY_RESERVE
from ..limits.lease import LeaseStore
from ..limits.pacer import LocalPacer
from ..limits.redisconn import ColdStartCheck
from ..schedule.models import ModelCache
from ..store.queue import PollQueue
from ..store.records import JobStore

if TYPE_CHECKING:
    from ..creates.drain import Drainer
from . import once
from .shared import budget_of, checked, key_client, read_gate, reader_ring, redis_check, redis_client


@once
def parts() -> tuple[Submitter, ColdStartCheck, Callable[[str | None], SubmitKey], LeaseStore, str]:
    s = SubmitSettings.from_env(os.environ)
    client, prefix, clock = redis_client(s.redis), s.redis.key_prefix, s.common.clock
    ring = reader_ring(s.sume, s.keys, s.budget)
    lease = LeaseStore(client, prefix)
    store = JobStore(s.common.jobs_table, s.jobs.pending_shards)

    def of_key(key: SumeKey) -> SubmitKey:
        creates = budget_of(client, prefix, key, "creates", s.common, NO_DAY_RESERVE)  # the queue keeps what waits
        pacer = LocalPacer(key.limits.creates_per_minute, key.limits.creates_per_day, s.budget.max_concurrency,
                           clock.now)
        return SubmitKey(key, key_client(s.sume, ring, key.id), creates, pacer)

    keys = PerKey(ring, of_key)
    create_queue = PollQueue(s.create_queue_url, clock) if s.create_queue_url else None
    submitter = Submitter(s, keys=keys, store=store, queue=PollQueue(s.poll_queue_url, clock), lease=lease,
                          models=ModelCache(store, clock.now), create_queue=create_queue)
    first = keys(ring.first().id)  # the cold-start check runs a key's own scripts
    return (submitter, redis_check(read_gate(lease, first.creates, s.redis, s.budget, s.common), s.redis), keys,
            lease, ring.default_id)


def submitter() -> Submitter:
    submit, check, *_ = parts()
    checked(check)
    return submit


@once
def drainer() -> Drainer:
    """The create queue's drain steps (over the submitter's parts: its keys, store and chains)."""
    from ..creates.drain import Drainer

    submit, check, keys, lease, default_id = parts()
    checked(check)
    assert submit.create_queue is not None, "a drain message without CREATE_QUEUE_URL"
    return Drainer(submit.s, submit, keys, submit.store, submit.create_queue, lease, default_id)
