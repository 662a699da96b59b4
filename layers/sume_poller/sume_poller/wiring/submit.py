"""The submit function's parts: the paid create with its Idempotency-Key, the job's first step."""

from __future__ import annotations

import os

from ..budget import Budget, LocalPacer
from ..lease import LeaseStore
from ..models import ModelCache
from ..queue import PollQueue
from ..redisconn import ColdStartCheck
from ..settings import SubmitSettings
from ..store import JobStore
from ..submit import Submitter
from . import checked, once, read_gate, redis_check, redis_client, sume_client


@once
def parts() -> tuple[Submitter, ColdStartCheck]:
    s = SubmitSettings.from_env(os.environ)
    client = redis_client(s.redis)
    clock = s.common.clock
    creates = Budget(client, f"{s.redis.key_prefix}!budget:{{creates}}", s.budget.creates_per_minute,
                     s.budget.creates_per_day, clock.now, early=clock.from_real(0.5), real_per_clock=clock.scale,
                     reserve_every=0.0)
    lease = LeaseStore(client, s.redis.key_prefix)
    store = JobStore(s.common.jobs_table, s.jobs.pending_shards)
    pacer = LocalPacer(s.budget.creates_per_minute, s.budget.creates_per_day, s.budget.max_concurrency, clock.now)
    submitter = Submitter(s, sume=sume_client(s.sume), store=store, queue=PollQueue(s.poll_queue_url, clock),
                          lease=lease, creates=creates, pacer=pacer, models=ModelCache(store, clock.now))
    return submitter, redis_check(read_gate(lease, creates, s.redis, s.budget, s.common), s.redis)


def submitter() -> Submitter:
    submit, check = parts()
    checked(check)
    return submit
