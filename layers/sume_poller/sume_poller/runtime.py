"""Per-container wiring: each function's parts are built once, on first use, from its settings.

A handler asks for what it runs (:func:`poll_runner`, :func:`fanout`, :func:`submitter`); the
settings are read and validated there, at cold start, and Redis is checked
(:class:`~sume_poller.redisconn.ColdStartCheck`: a misconfigured Redis fails the invocation
loudly, counted as ``RedisMisconfigured``; an unreachable one is an outage the parts ride out).
:func:`reset` forgets everything (local runs and tests change the environment between cases).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache
from typing import Any

from .batch import BatchRunner
from .budget import Budget, LocalPacer
from .coverage import CoverageStore, CoverageView
from .credentials import Secret
from .events import EventBus
from .fanout import FanOut
from .gate import ReadGate
from .lease import LeaseStore
from .models import ModelCache
from .observability import MetricUnit, metrics
from .poller import Poller
from .queue import PollQueue
from .redisconn import ColdStartCheck, RedisMisconfigured, connect
from .settings import (
    BudgetSettings,
    Common,
    FanOutSettings,
    PollSettings,
    RedisSettings,
    SubmitSettings,
    SumeSettings,
    SweepFunctionSettings,
    WebhookSettings,
)
from .store import JobStore, ResultBucket
from .submit import Submitter
from .sume import SumeClient
from .sweep import Sweeper, SweepSettings
from .webhook import WebhookReceiver


@cache
def redis_client(settings: RedisSettings) -> Any:
    return connect(settings)


def redis_check(settings: RedisSettings, lease: LeaseStore, budget: Budget) -> ColdStartCheck:
    """The cold-start check of a function's Redis: the gate's scripts on the probe key."""
    gate = ReadGate(lease, budget, cluster=settings.mode == "cluster")
    return ColdStartCheck(lease.client, settings.mode, gate.probe)


def checked(check: ColdStartCheck) -> None:
    try:
        check()
    except RedisMisconfigured:
        metrics.add_metric(name="RedisMisconfigured", unit=MetricUnit.Count, value=1)
        raise


def reads_budget(client: Any, prefix: str, budget: BudgetSettings, common: Common) -> Budget:
    clock = common.clock
    return Budget(client, f"{prefix}!budget:reads", budget.reads_per_minute, budget.reads_per_day, clock.now,
                  early=clock.from_real(0.5))


def sume_client(settings: SumeSettings, **options: Any) -> SumeClient:
    key = Secret(settings.api_key_name, settings.api_key_source)
    return SumeClient(settings.base_url, key, connect_timeout=settings.connect_timeout_real,
                      read_timeout=settings.read_timeout_real, on_key_rejected=key.invalidate, **options)


@cache
def _poll_parts() -> tuple[BatchRunner, ColdStartCheck]:
    s = PollSettings.from_env(os.environ)
    client = redis_client(s.redis)
    lease = LeaseStore(client, s.redis.key_prefix)
    budget = reads_budget(client, s.redis.key_prefix, s.budget, s.common)
    queue = PollQueue(s.poll_queue_url, s.common.clock)
    store = JobStore(s.common.jobs_table, s.jobs.pending_shards, results=ResultBucket(s.result_bucket))
    poller = Poller(s, gate=ReadGate(lease, budget, cluster=s.redis.mode == "cluster"), budget=budget,
                    pacer=LocalPacer(s.budget.reads_per_minute, s.budget.reads_per_day, s.budget.max_concurrency,
                                     s.common.clock.now),
                    sume=sume_client(s.sume, result_max_bytes=s.result_max_megabytes * 1_000_000), store=store,
                    bus=EventBus(s.event_bus_name), queue=queue, models=ModelCache(store, s.common.clock.now),
                    coverage=CoverageView(CoverageStore(client, s.redis.key_prefix), s.common.clock.now))
    return BatchRunner(poller, queue, safety_margin_ms=s.safety_margin_ms), redis_check(s.redis, lease, budget)


def poll_runner() -> BatchRunner:
    runner, check = _poll_parts()
    checked(check)
    return runner


@cache
def _fanout_parts() -> tuple[FanOutSettings, JobStore, PollQueue, LeaseStore, Budget]:
    s = FanOutSettings.from_env(os.environ)
    client = redis_client(s.redis)
    return (s, JobStore(s.common.jobs_table, s.jobs.pending_shards), PollQueue(s.poll_queue_url, s.common.clock),
            LeaseStore(client, s.redis.key_prefix), reads_budget(client, s.redis.key_prefix, s.budget, s.common))


def fanout(remaining_ms: Callable[[], int]) -> FanOut:
    """A fan-out run for one invocation (its parts are built once per container)."""
    parts = _fanout_parts()
    checked(_check_of(parts[0].redis, parts[3], parts[4]))
    return FanOut(*parts, remaining_ms)


@cache
def _check_of(settings: RedisSettings, lease: LeaseStore, budget: Budget) -> ColdStartCheck:
    return redis_check(settings, lease, budget)


@cache
def submitter() -> Submitter:
    s = SubmitSettings.from_env(os.environ)
    client = redis_client(s.redis)
    clock = s.common.clock
    creates = Budget(client, f"{s.redis.key_prefix}!budget:creates", s.budget.creates_per_minute,
                     s.budget.creates_per_day, clock.now, early=clock.from_real(0.5))
    store = JobStore(s.common.jobs_table, s.jobs.pending_shards)
    lease = LeaseStore(client, s.redis.key_prefix)
    checked(_check_of(s.redis, lease, creates))
    return Submitter(s, sume=sume_client(s.sume), store=store, queue=PollQueue(s.poll_queue_url, clock),
                     lease=lease, creates=creates,
                     pacer=LocalPacer(s.budget.creates_per_minute, s.budget.creates_per_day, s.budget.max_concurrency,
                                      clock.now),
                     models=ModelCache(store, clock.now))


@cache
def _sweep_parts() -> tuple[SweepFunctionSettings, dict[str, Any]]:
    s = SweepFunctionSettings.from_env(os.environ)
    client = redis_client(s.redis)
    return s, {"sume": sume_client(s.sume), "store": JobStore(s.common.jobs_table, s.jobs.pending_shards),
               "queue": PollQueue(s.poll_queue_url, s.common.clock), "lease": LeaseStore(client, s.redis.key_prefix),
               "budget": reads_budget(client, s.redis.key_prefix, s.budget, s.common),
               "coverage": CoverageStore(client, s.redis.key_prefix)}


def sweeper(remaining_ms: Callable[[], int]) -> Sweeper:
    """A sweep for one invocation (its parts are built once per container)."""
    s, parts = _sweep_parts()
    checked(_check_of(s.redis, parts["lease"], parts["budget"]))
    return Sweeper(SweepSettings(s.period, s.max_pages, s.lag, s.safety_margin_ms, s.read_share / 100),
                   s.common.clock,
                   remaining_ms=remaining_ms, handover_ttl_real=s.lease.claim_ttl, margin_real=s.lease.margin, **parts)


@cache
def webhook_receiver() -> WebhookReceiver:
    s = WebhookSettings.from_env(os.environ)
    client = redis_client(s.redis)
    return WebhookReceiver(s.common.clock, secret=Secret(s.secret_name, s.secret_source), tolerance=s.tolerance,
                           store=JobStore(s.common.jobs_table, s.jobs.pending_shards),
                           lease=LeaseStore(client, s.redis.key_prefix),
                           queue=PollQueue(s.poll_queue_url, s.common.clock), handover_ttl_real=s.lease.claim_ttl,
                           margin_real=s.lease.margin,
                           coverage=CoverageStore(client, s.redis.key_prefix))


def reset() -> None:
    """Forget every part, setting and cached secret (local runs and tests change the environment;
    the boto3 clients follow it themselves, see :func:`sume_poller.aws.client`)."""
    for cached in (redis_client, _poll_parts, _fanout_parts, _check_of, submitter, _sweep_parts, webhook_receiver):
        cached.cache_clear()
