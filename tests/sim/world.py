"""The whole poll system in one process: the layer's real parts over the simulation's fakes.

Each function's parts are built as its wiring module builds them (``sume_poller.wiring``: poll,
fan-out, sweep, webhook, submit) - the same classes, settings read from the same environment
variables by the same ``from_env`` - but over the fakes (:mod:`.redis_fake`, :mod:`.dynamo_fake`,
:mod:`.sqs_fake`, :mod:`.s3_fake`, :mod:`.events_fake`, :mod:`.sume_fake`) and on the scheduler's
clock. Each Lambda container has its own parts (its outage pacer, key check, caches), is reused warm
and thrown away when an invocation of it dies. What AWS runs around the functions is played here:
the SQS event source mappings of the poll and create queues (batches, concurrency, partial batch
failures, redelivery after the visibility timeout, the redrive to the dead-letter queue), the
EventBridge schedules of fan-out and sweeps, Sume's webhook deliveries, and the callers' submissions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import secrets
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import botocore.endpoint

from sume_poller.config.keys import Limits, SumeKey
from sume_poller.core.aws import AwsError
from sume_poller.core.clock import Clock
from sume_poller.creates.drain import Drainer
from sume_poller.creates.submit import SubmitRetryable, SubmitSettings, Submitter, one_key
from sume_poller.discovery.coverage import CoverageStore, CoverageView
from sume_poller.discovery.sweep import Sweeper, SweepFunctionSettings, Sweeps
from sume_poller.discovery.webhook import WebhookReceiver, WebhookSettings
from sume_poller.limits import gate as gate_module
from sume_poller.limits.budget import NO_DAY_RESERVE, Budget
from sume_poller.limits.gate import ReadGate
from sume_poller.limits.lease import LeaseStore
from sume_poller.limits.pacer import LocalPacer
from sume_poller.limits.redisconn import Breaker, RedisFailure
from sume_poller.poll import batch as batch_module
from sume_poller.poll.batch import BatchRunner
from sume_poller.poll.cadence import Cadence
from sume_poller.poll.fanout import FanOut, FanOutSettings, Lane
from sume_poller.poll.poller import Poller, PollSettings
from sume_poller.poll.step import Deadline
from sume_poller.schedule.models import ModelCache
from sume_poller.store.events import EventBus
from sume_poller.store.queue import PollQueue
from sume_poller.store.records import JobStore, ResultBucket
from sume_poller.sume.client import SumeClient
from tools.sume_sim.config import Config, updated
from tools.sume_sim.model import Model

from .dynamo_fake import DynamoWorld
from .events_fake import EventsWorld
from .plan import MAX_RECEIVE, TIMEOUTS, VISIBILITY, Faults, Plan
from .redis_fake import RedisWorld
from .s3_fake import S3World
from .scheduler import Invocation, Killed, Scheduler, SimExecutor, SimThreading, Source
from .sqs_fake import Queue, SqsWorld
from .sume_fake import BASE, Transport

#: The clock's origin: 2026-06-01T00:00:00Z (any instant; a day window starts at midnight UTC).
START = 1_780_272_000.0
API_KEY = "sume_test_key"
WEBHOOK_SECRET = "sume_sim_webhook_secret"
PREFIX = "sume:poll:"
#: Lambda's retries of an asynchronous invocation that failed.
ASYNC_RETRIES = 2


@contextlib.contextmanager
def deterministic(seed: int, sched: Scheduler) -> Iterator[None]:
    """What a run needs of the process to replay exactly: ids and tokens from a seeded stream
    (``secrets.token_hex``: chain tokens, nonces, job and request ids), the global ``random`` seeded
    (jitter, botocore's backoff), no wall clock and no real sleep (the batch's deadline, the key
    check's slot wait, botocore's retry sleep: the scheduler's clock), the layer's locks waiting on the
    scheduler (:class:`~tests.sim.scheduler.SimThreading`), its thread pools' tasks actors of the
    caller's invocation (:class:`~tests.sim.scheduler.SimExecutor`), and logging off (cost)."""
    tokens = random.Random(seed ^ 0x5EED)

    def token_hex(nbytes: int | None = None) -> str:
        n = 32 if nbytes is None else nbytes
        return tokens.getrandbits(8 * n).to_bytes(n, "big").hex()

    class SimTime:
        """What the patched modules read of :mod:`time`."""

        @staticmethod
        def sleep(seconds: float) -> None:
            sched.sleep(seconds, "sleep")

        @staticmethod
        def monotonic() -> float:
            return sched.now

        @staticmethod
        def time() -> float:
            return sched.now

    shim = SimThreading(sched, threading)

    def executor(max_workers: int | None = None, thread_name_prefix: str = "") -> SimExecutor:
        """A pool the layer starts during a run (fan-out's sender): its tasks are actors of the caller's
        invocation, so their service calls are scheduled like every other."""
        return SimExecutor(sched, lambda: sched.current.invocation, thread_name_prefix or "pool")  # type: ignore[union-attr]

    patches: list[tuple[Any, str, Any]] = [
        (secrets, "token_hex", token_hex),
        (batch_module, "Deadline", lambda seconds: Deadline(seconds, now=sched.clock)),
        (gate_module, "time", SimTime),
        (botocore.endpoint, "time", SimTime),
        *((m, "threading", shim) for name, m in sorted(sys.modules.items())
          if name.startswith("sume_poller") and getattr(m, "threading", None) is threading),
        *((m, "ThreadPoolExecutor", executor) for name, m in sorted(sys.modules.items())
          if name.startswith("sume_poller") and getattr(m, "ThreadPoolExecutor", None) is ThreadPoolExecutor)]
    saved = [(target, name, getattr(target, name)) for target, name, _ in patches]
    state = random.getstate()
    for target, name, value in patches:
        setattr(target, name, value)
    random.seed(seed)
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        random.setstate(state)
        for target, name, value in reversed(saved):
            setattr(target, name, value)


@contextlib.contextmanager
def the_layers_aws(world: World) -> Iterator[None]:
    """The AWS clients the layer builds itself (``sume_poller.core.aws.client``): the events module's,
    answered by ``world``."""
    from sume_poller.store import events

    saved = getattr(events, "client")  # noqa: B009 - a name the module imports, replaced for the run
    setattr(events, "client", world.events.layer_client)  # noqa: B010
    try:
        yield
    finally:
        setattr(events, "client", saved)  # noqa: B010


class SimClock(Clock):
    """The project's clock (scale 1) reading the scheduler's time."""

    def __init__(self, sched: Scheduler) -> None:
        super().__init__(1.0, wall=sched.clock)


class World:
    def __init__(self, plan: Plan, sched: Scheduler) -> None:
        self.plan = plan
        self.sched = sched
        self.faults = Faults(sched.rng, plan.rates, plan.budget, self.faultable)
        self.clock = SimClock(sched)
        self.redis = RedisWorld(sched, self.faults)
        self.redis.timeout = float(self._settings(PollSettings, dict(plan.env)).redis.timeout_real)
        self.ddb = DynamoWorld(sched, self.faults, "jobs")
        self.sqs = SqsWorld(sched, self.faults)
        self.s3 = S3World(sched, self.faults)
        self.events = EventsWorld(sched, self.faults)
        self.poll_dlq = self.sqs.queue("poll-dlq", VISIBILITY)
        self.poll_queue = self.sqs.queue("poll", VISIBILITY, dlq=self.poll_dlq, max_receive=MAX_RECEIVE)
        self.create_dlq = self.sqs.queue("create-dlq", VISIBILITY)
        self.create_queue = self.sqs.queue("create", VISIBILITY, dlq=self.create_dlq, max_receive=MAX_RECEIVE)
        sume_config = updated(Config(time_scale=1.0), {"api_key": API_KEY, "seed": plan.seed, **plan.sume},
                              initial=True)
        self.model = Model(self.clock, sume_config)
        self.sume = Transport(sched, self.faults, self.model)
        env = dict(plan.env)
        self.poll_settings = self._settings(PollSettings, env)
        self.fanout_settings = self._settings(FanOutSettings, env)
        self.sweep_settings = self._settings(SweepFunctionSettings, env)
        self.submit_settings = self._settings(SubmitSettings, env)
        self.webhook_settings = self._settings(WebhookSettings, env)
        self.containers: dict[str, list[Any]] = {}
        self.running: dict[str, int] = {}
        self.numbers: dict[str, int] = {}
        #: Each poll worker actor's step outcome: actor -> Outcome, or the exception / Killed it ended with.
        self.step_ends: dict[Any, Any] = {}
        self.submissions_left = 0
        self.pending_retries = 0
        #: Told of each message a delivery left undeleted (its body): it comes back after the visibility timeout.
        self.delivery_failed: list[Callable[[str], None]] = []
        #: Called with each drain invocation's report, when the invocation returned it (a crash loses it,
        #: as it loses the metrics a Lambda had not flushed).
        self.drain_reports: list[Callable[[Any], None]] = []
        self.replies: list[dict[str, Any]] = []
        self.crashes: list[str] = []

    def _settings(self, cls: Any, env: dict[str, str]) -> Any:
        settings = cls.from_env(env)
        return dataclasses.replace(settings, common=dataclasses.replace(settings.common, clock=self.clock))

    # -- what each function's container holds (mirrors sume_poller.wiring) -------------------------------
    def key(self) -> SumeKey:
        s = self.poll_settings
        return SumeKey("default", Limits(s.budget.reads_per_minute, s.budget.reads_per_day,
                                         s.budget.creates_per_minute, s.budget.creates_per_day),
                       lambda: API_KEY, lambda: WEBHOOK_SECRET, default=True)

    def sume_client(self, settings: Any, **options: Any) -> SumeClient:
        client = SumeClient(BASE, lambda: API_KEY, connect_timeout=settings.sume.connect_timeout_real,
                            read_timeout=settings.sume.read_timeout_real, **options)
        client._http = self.sume  # type: ignore[assignment]  # the transport: the simulator's model in process
        return client

    def store(self, settings: Any, results: bool = False) -> JobStore:
        bucket = ResultBucket(settings.result_bucket, s3=self.s3.client) if results else None
        return JobStore(settings.common.jobs_table, settings.jobs.pending_shards, ddb=self.ddb.client, results=bucket,
                        retention_days=settings.common.retention_days, wall=self.sched.clock)

    def reads_budget(self, client: Any, settings: Any) -> Budget:
        key, clock = self.key(), self.clock
        return Budget(client, key.budget_name(PREFIX, "reads"), key.limits.reads_per_minute,
                      key.limits.reads_per_day, clock.now, early=clock.from_real(0.5), real_per_clock=clock.scale,
                      reserve_every=settings.budget.reserve_every)

    def gate(self, lease: LeaseStore, budget: Budget, settings: Any) -> ReadGate:
        pacer = LocalPacer(budget.per_minute, budget.per_day, settings.budget.max_concurrency, self.clock.now)
        return ReadGate(lease, budget, pacer, cluster=False, breaker=Breaker(now=self.clock.now))

    def poll_container(self, name: str) -> dict[str, Any]:
        s, clock = self.poll_settings, self.clock
        client = self.redis.client()
        lease = LeaseStore(client, PREFIX)
        queue = PollQueue(s.poll_queue_url, clock, sqs=self.sqs.client)
        store = self.store(s, results=True)
        bus = EventBus(s.event_bus_name)  # its client built as the layer builds it (EventsWorld.layer_client)
        budget = self.reads_budget(client, s)
        gate = self.gate(lease, budget, s)
        cadence = Cadence(s, models=ModelCache(store, clock.now), rate=budget.rate,
                          coverage=CoverageView(CoverageStore(client, PREFIX), clock.now),
                          rng=random.Random(self.sched.rng.getrandbits(32)))
        poller = Poller(s, gate=gate, sume=self.sume_client(s, result_max_bytes=s.result_max_megabytes * 1_000_000),
                        store=store, bus=bus, queue=queue, cadence=cadence)
        runner = BatchRunner(poller, queue, safety_margin_ms=s.safety_margin_ms)
        container: dict[str, Any] = {"name": name, "runner": runner, "invocation": None}
        runner._pool = SimExecutor(self.sched, lambda: container["invocation"], name,  # type: ignore[assignment]
                                   self._step_end)
        runner.step_hook = self.step_hook
        return container

    def fanout(self, remaining_ms: Callable[[], int]) -> FanOut:
        s = self.fanout_settings
        client = self.redis.client()
        lease = LeaseStore(client, PREFIX)
        budget = self.reads_budget(client, s)
        store = self.store(s)
        return FanOut(s, store, PollQueue(s.poll_queue_url, self.clock, sqs=self.sqs.client), lease, None,
                      remaining_ms, lanes=[Lane("default", budget, PREFIX)],
                      create_queue=PollQueue(s.create_queue_url, self.clock, sqs=self.sqs.client))

    def sweeps(self, remaining_ms: Callable[[], int]) -> Sweeps:
        s = self.sweep_settings
        client = self.redis.client()
        settings = s.sweep()
        return Sweeps([Sweeper(settings, self.clock, remaining_ms=remaining_ms, handover_ttl_real=s.lease.claim_ttl,
                               margin_real=s.lease.margin, sume=self.sume_client(s),
                               store=self.store(s),
                               queue=PollQueue(s.poll_queue_url, self.clock, sqs=self.sqs.client),
                               lease=LeaseStore(client, PREFIX), budget=self.reads_budget(client, s),
                               coverage=CoverageStore(client, PREFIX), key=self.key())])

    def webhook(self) -> WebhookReceiver:
        s = self.webhook_settings
        client = self.redis.client()
        return WebhookReceiver(self.clock, secrets=lambda: {"default": WEBHOOK_SECRET}, default_key="default",
                               tolerance=s.tolerance,
                               store=self.store(s),
                               lease=LeaseStore(client, PREFIX),
                               queue=PollQueue(s.poll_queue_url, self.clock, sqs=self.sqs.client),
                               handover_ttl_real=s.lease.claim_ttl, margin_real=s.lease.margin,
                               coverage=lambda key: CoverageStore(client, PREFIX))

    def submit_container(self, name: str) -> dict[str, Any]:
        s, clock = self.submit_settings, self.clock
        client = self.redis.client()
        lease = LeaseStore(client, PREFIX)
        store = self.store(s)
        key = self.key()
        creates = Budget(client, key.budget_name(PREFIX, "creates"), key.limits.creates_per_minute,
                         key.limits.creates_per_day, clock.now, early=clock.from_real(0.5), real_per_clock=clock.scale,
                         reserve_every=NO_DAY_RESERVE)
        pacer = LocalPacer(key.limits.creates_per_minute, key.limits.creates_per_day, s.budget.max_concurrency,
                           clock.now)
        keys = one_key(self.sume_client(s), creates, pacer)
        create_queue = PollQueue(s.create_queue_url, clock, sqs=self.sqs.client)
        submitter = Submitter(s, keys=keys, store=store, queue=PollQueue(s.poll_queue_url, clock, sqs=self.sqs.client),
                              lease=lease, models=ModelCache(store, clock.now), sleep=self.sched.sleep,
                              create_queue=create_queue)
        drainer = Drainer(s, submitter, keys, store, create_queue, lease, "default")
        return {"name": name, "submitter": submitter, "drainer": drainer, "keys": keys}

    def _step_end(self, actor: Any, outcome: Any, error: BaseException | None) -> None:
        """How a poll record's step ended: "ok", "failed" (its record is delivered again), "error" (an
        exception escaped the batch adapter) or "killed"."""
        if isinstance(error, Killed):
            self.step_ends[actor] = "killed"
        elif error is not None:
            self.step_ends[actor] = "error"
        else:
            self.step_ends[actor] = "failed" if getattr(outcome, "failed", False) else "ok"

    # -- faults inside the functions ---------------------------------------------------------------------
    def faultable(self) -> bool:
        actor = self.sched.current
        return actor is None or actor.invocation.faultable

    def step_hook(self, name: str, job_id: str) -> None:
        """The poller's named steps (claimed, read, result, written, published, released, rested, sent):
        the scheduler may crash the invocation there."""
        if self.faults.take("crash_step"):
            self.sched.note_fault(f"crash at {name} of {job_id}")
            self.sched.crash(f"crash at {name}")

    def on_resume(self) -> None:
        """After every point: the scheduler may crash the invocation at this service call."""
        if self.sched.current is not None and self.faults.take("crash"):
            self.sched.note_fault("crash at a service call")
            self.sched.crash("crash")

    # -- invocations ----------------------------------------------------------------------------------------
    def _name(self, function: str) -> str:
        self.numbers[function] = self.numbers.get(function, 0) + 1
        return f"{function}#{self.numbers[function]}"

    def _container(self, function: str, build: Callable[[str], dict[str, Any]], name: str) -> dict[str, Any]:
        idle = self.containers.setdefault(function, [])
        return idle.pop(0) if idle else build(name)

    def invoke(self, function: str, body: Callable[[Invocation, dict[str, Any] | None], None],
               build: Callable[[str], dict[str, Any]] | None = None, ended: Callable[[], None] | None = None,
               fails: Callable[[BaseException | None], None] | None = None, faultable: bool = True) -> None:
        """One invocation of ``function``: its handler thread as an actor (the container reused warm;
        thrown away when the invocation dies). ``faultable`` False: no fault is injected into it (the
        last tries of a message or an event: a transient fault does not fail anything for good)."""
        name = self._name(function)
        inv = self.sched.invocation(name, TIMEOUTS[function])
        inv.faultable = faultable
        container = self._container(function, build, name) if build is not None else None
        if container is not None:
            container["invocation"] = inv
        self.running[function] = self.running.get(function, 0) + 1

        def done(error: BaseException | None) -> None:
            self.running[function] -= 1
            if error is None and not inv.killed and container is not None:
                self.containers[function].append(container)
            expected = isinstance(error, (Killed, SubmitRetryable, RuntimeError, *AwsError, *RedisFailure))
            if error is not None and not expected:
                self.crashes.append(f"{name}: {type(error).__name__}: {error}")
            if ended is not None:
                ended()
            if fails is not None:
                fails(error)

        self.sched.spawn(name, inv, lambda: body(inv, container), done)

    def remaining(self, inv: Invocation) -> Callable[[], int]:
        return lambda: max(0, int((inv.end - self.sched.now) * 1000))

    def poll_batch(self, queue: Queue, function: str) -> None:
        """Lambda's SQS poller: receive a batch, invoke, delete what succeeded (a crash deletes nothing)."""
        received = self.sqs.receive(queue, self.sched.rng.randint(1, self.plan.batch_size if function == "poll" else 1))
        if not received:
            return

        pending = {m.id: m for m, _ in received}

        def body(inv: Invocation, container: dict[str, Any] | None) -> None:
            assert container is not None
            records = [{"messageId": m.id, "receiptHandle": receipt, "body": m.body} for m, receipt in received]
            if function == "poll":
                report = container["runner"].run({"Records": records}, self.remaining(inv))
                failed = set(report.failures)
            else:
                drained = container["drainer"].run({"Records": records}, self.remaining(inv))
                for observer in self.drain_reports:
                    observer(drained)
                failed = set(drained.failures)
            for message, receipt in received:
                if message.id not in failed:
                    self.sched.point(f"sqs delete {message.id}", crashable=False)
                    self.sqs.delete(queue, receipt)
                    pending.pop(message.id, None)

        def ended() -> None:
            for message in pending.values():
                for observer in self.delivery_failed:
                    observer(message.body)

        build = self.poll_container if function == "poll" else self.submit_container
        faultable = all(m.receive_count <= MAX_RECEIVE - 2 for m, _ in received)
        self.invoke(function, body, build, ended, faultable=faultable)

    def submit(self, event: dict[str, Any], attempt: int = 0) -> None:
        """An asynchronous invoke of the submit function: Lambda retries one that fails or times out
        twice, a minute and then two after it (the same event: its Idempotency-Key replays)."""
        def body(inv: Invocation, container: dict[str, Any] | None) -> None:
            assert container is not None
            reply = container["submitter"].handle(dict(event), self.remaining(inv))
            self.replies.append({"event": event, "reply": reply})

        def ended(error: BaseException | None) -> None:
            if error is not None and attempt < ASYNC_RETRIES:
                self.pending_retries += 1
                self.sched.at(self.sched.now + 60.0 * (attempt + 1), lambda: self._retry(event, attempt + 1))

        self.invoke("submit", body, self.submit_container, fails=ended, faultable=attempt < ASYNC_RETRIES)

    def _retry(self, event: dict[str, Any], attempt: int) -> None:
        self.pending_retries -= 1
        self.submit(event, attempt)

    def fanout_tick(self) -> None:
        def body(inv: Invocation, _: Any) -> None:
            self.fanout(self.remaining(inv)).run()

        self.invoke("fanout", body)

    def sweep_tick(self) -> None:
        def body(inv: Invocation, _: Any) -> None:
            self.sweeps(self.remaining(inv)).run()

        self.invoke("sweep", body)

    def deliver_webhook(self, delivery: Any) -> None:
        receiver = self.webhook()

        def body(inv: Invocation, _: Any) -> None:
            statuses: list[int | str] = []
            for _copy in range(delivery.copies):
                try:
                    statuses.append(receiver.handle(delivery.headers, delivery.plan.body).status)
                except Killed:
                    raise
                except Exception as exc:  # a function URL answers 500; Sume does not retry
                    statuses.append(type(exc).__name__)
            self.model.record_delivery(delivery, statuses)

        self.invoke("webhook", body)


class Every(Source):
    """A schedule (EventBridge): a tick every ``period`` clock seconds; a tick while the function's
    previous one still runs is skipped (reserved concurrency 1)."""

    def __init__(self, world: World, name: str, period: float, offset: float, start: Callable[[], None]) -> None:
        self.world = world
        self.name = name
        self.period = period
        self.next = START + offset
        self._start = start

    def ready(self) -> bool:
        return self.world.sched.now >= self.next

    def start(self) -> None:
        while self.next <= self.world.sched.now:
            self.next += self.period
        if self.world.running.get(self.name, 0) == 0:
            self._start()

    def due(self) -> float:
        return self.next


class EventSource(Source):
    """Lambda's SQS event source mapping of one queue: a batch whenever messages are visible and the
    mapping's concurrency allows another invocation."""

    def __init__(self, world: World, queue: Queue, function: str, concurrency: int) -> None:
        self.world = world
        self.queue = queue
        self.name = f"deliver {queue.name}"
        self.function = function
        self.concurrency = concurrency
        self.weight = 2.0

    def ready(self) -> bool:
        return (self.world.running.get(self.function, 0) < self.concurrency
                and bool(self.queue.visible(self.world.sched.now)))

    def start(self) -> None:
        self.world.poll_batch(self.queue, self.function)

    def due(self) -> float | None:
        return self.queue.next_visible(self.world.sched.now)


class Webhooks(Source):
    """Sume's webhook deliveries, as its model planned them."""

    name = "webhook"

    def __init__(self, world: World) -> None:
        self.world = world

    def ready(self) -> bool:
        due = self.world.model.next_webhook_due()
        return due is not None and due <= self.world.sched.now

    def start(self) -> None:
        for delivery in self.world.model.take_due_webhooks():
            self.world.deliver_webhook(delivery)

    def due(self) -> float | None:
        return self.world.model.next_webhook_due()


class IndexLag(Source):
    """The index's pending updates: a due time only (queries settle them)."""

    name = "index"

    def __init__(self, world: World) -> None:
        self.world = world

    def due(self) -> float | None:
        return self.world.ddb.index_due()
