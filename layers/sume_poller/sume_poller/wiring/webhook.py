"""The webhook function's parts: verified deliveries handed to a read now."""

from __future__ import annotations

import os

from ..coverage import CoverageStore
from ..credentials import Secret
from ..lease import LeaseStore
from ..queue import PollQueue
from ..settings import WebhookSettings
from ..store import JobStore
from ..webhook import WebhookReceiver
from . import once, redis_client


@once
def receiver() -> WebhookReceiver:
    s = WebhookSettings.from_env(os.environ)
    client = redis_client(s.redis)
    return WebhookReceiver(s.common.clock, secret=Secret(s.secret_name, s.secret_source), tolerance=s.tolerance,
                           store=JobStore(s.common.jobs_table, s.jobs.pending_shards),
                           lease=LeaseStore(client, s.redis.key_prefix),
                           queue=PollQueue(s.poll_queue_url, s.common.clock), handover_ttl_real=s.lease.claim_ttl,
                           margin_real=s.lease.margin, coverage=CoverageStore(client, s.redis.key_prefix))
