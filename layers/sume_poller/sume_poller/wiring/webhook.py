"""The webhook function's parts: verified deliveries handed to a read now; each key's signing
secret (the default key's from ``WEBHOOK_SECRET_NAME``, the others' from the key configuration)."""

from __future__ import annotations

import os

from ..config.keys import Limits, PerKey
from ..discovery.coverage import CoverageStore
from ..discovery.webhook import WebhookReceiver, WebhookSettings
from ..limits.lease import LeaseStore
from ..store.queue import PollQueue
from ..store.records import JobStore
from . import once
from .shared import key_ring, redis_client


@once
def receiver() -> WebhookReceiver:
    s = WebhookSettings.from_env(os.environ)
    client, prefix = redis_client(s.redis), s.redis.key_prefix
    own = (s.secret_name, s.secret_source) if s.secret_name else None
    ring = key_ring(s.keys, Limits(), webhook_secret=own, default=own is not None)  # limits: not used here

    def secrets() -> dict[str, str]:
        return {k.id: k.webhook_secret() for k in ring.all() if k.webhook_secret is not None}

    return WebhookReceiver(s.common.clock, secrets=secrets, default_key=s.keys.default_id, tolerance=s.tolerance,
                           store=JobStore(s.common.jobs_table, s.jobs.pending_shards),
                           lease=LeaseStore(client, prefix), queue=PollQueue(s.poll_queue_url, s.common.clock),
                           handover_ttl_real=s.lease.claim_ttl, margin_real=s.lease.margin,
                           coverage=PerKey(ring, lambda key: CoverageStore(client, key.scope(prefix))))
