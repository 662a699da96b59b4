"""Per-container wiring: each client is built once, on first use, from validated settings."""

from __future__ import annotations

from functools import cache

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .aws import EventBus, JobStore, PollQueue, reset_session
from .config import Settings, get_settings
from .keys import ApiKeyProvider
from .lease import LeaseStore
from .poller import Poller
from .sume import SumeClient


@cache
def settings() -> Settings:
    return get_settings()


@cache
def redis_client() -> redis.Redis:
    s = settings()
    return redis.Redis.from_url(
        s.redis_url,
        socket_timeout=s.redis_timeout,
        socket_connect_timeout=s.redis_timeout,
        retry=Retry(NoBackoff(), 1),
        health_check_interval=30,
        decode_responses=True,
        max_connections=32,
    )


@cache
def lease_store() -> LeaseStore:
    return LeaseStore(redis_client(), settings().lease_key_prefix)


@cache
def sume_client() -> SumeClient:
    s = settings()
    key = ApiKeyProvider(s)
    return SumeClient(s.sume_base_url, key, connect_timeout=s.sume_connect_timeout,
                      read_timeout=s.sume_read_timeout, on_auth_failure=key.invalidate)


@cache
def job_store() -> JobStore:
    return JobStore(settings().jobs_table)


@cache
def poll_queue() -> PollQueue:
    return PollQueue(settings().poll_queue_url)


@cache
def event_bus() -> EventBus:
    return EventBus(settings().event_bus_name)


@cache
def poller() -> Poller:
    return Poller(settings(), lease_store(), sume_client(), job_store(), poll_queue(), event_bus())


def reset() -> None:
    """Forget every cached client and the settings (tests and local runs change the environment)."""
    for f in (settings, redis_client, lease_store, sume_client, job_store, poll_queue, event_bus, poller):
        f.cache_clear()
    get_settings.cache_clear()
    reset_session()
