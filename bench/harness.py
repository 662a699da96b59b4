"""Bench-only stand-ins and counters shared by the figures.

* :class:`MemQueue` - the real :class:`sume_poller.store.queue.PollQueue` (its batching, its SQS delay
  rounding) over an in-memory SQS queue: delays, visibility timeout, receive up to 10. It is
  the poll queue of figure 1: moto's SQS scans every message it holds on every call, so a few
  hundred jobs in flight would lag deliveries by seconds - that would measure moto, not the lease.
* :class:`EventSource` - plays Lambda's SQS event source mapping over a :class:`MemQueue` with
  the real batch adapter (:class:`sume_poller.poll.batch.BatchRunner`): concurrent invocations,
  optional duplicate delivery, a fan-out tick and crashing invocations.
* :class:`DetachedQueue` - the poll queue of a Poller driven by hand (figures 2 and 8).
* :class:`NoLeaseGate` - the read gate with the lease disabled (figure 1's baseline).
* :class:`CountingStore` / :class:`CountingBus` - the real DynamoDB / EventBridge adapters,
  counting terminal writes won and terminal events per job.
* Redis counters: :class:`RedisCounter` counts round trips server-side (``INFO``:
  ``total_reads_processed``, one per request read; a large pipeline may arrive in several) over
  one server or every node of a cluster; :func:`counting_client` counts them client-side.
* :func:`layer_logs_to` - the layer's log lines into a file (figures that run the layer's parts
  without a local stack, which would do that itself).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from sume_poller.limits.budget import Budget
from sume_poller.limits.gate import Passage, ReadGate
from sume_poller.limits.lease import Claim, LeaseStore, Step
from sume_poller.limits.pacer import LocalPacer
from sume_poller.poll.cadence import Cadence
from sume_poller.poll.poller import Poller
from sume_poller.store.events import EventBus
from sume_poller.store.queue import Outgoing, PollQueue
from sume_poller.store.records import JobStore, TerminalWrite

# -- the poll queue in memory --------------------------------------------------------------------


@dataclass
class _Message:
    message_id: str
    body: str
    visible_at: float
    receipt: int = 0
    receives: int = 0
    copy: bool = False  # a bench-made duplicate (not duplicated again)


@dataclass(frozen=True)
class Received:
    message_id: str
    receipt: int
    body: str
    copy: bool


class _NoSqs:
    """Never called: the queues below replace the only method that would."""


class MemQueue(PollQueue):
    """PollQueue's sending (chunks of ten, SQS's whole-second delays) into an in-memory queue;
    times are ``time.monotonic()`` seconds (figure 1 runs at clock scale 1)."""

    def __init__(self, clock: Any, visibility_timeout: float = 180.0) -> None:
        super().__init__("memory://poll", clock, sqs=_NoSqs())
        self.visibility_timeout = visibility_timeout
        self._cond = threading.Condition()
        self._messages: dict[str, _Message] = {}
        self._heap: list[tuple[float, int, str, int]] = []  # (visible_at, tiebreak, id, receipt)
        self._ids = itertools.count(1)
        #: Seconds each message waited past its due time before its first delivery (event source lag).
        self.lags: list[float] = []

    def _send_batch(self, chunk: list[Outgoing]) -> set[str]:
        for message in chunk:
            self.put(message.body, float(self.real_delay(message.delay)))
        return set()

    def put(self, body: str, delay: float, *, copy: bool = False) -> None:
        with self._cond:
            message = _Message(f"m{next(self._ids)}", body, time.monotonic() + delay, copy=copy)
            self._messages[message.message_id] = message
            self._push(message)
            self._cond.notify_all()

    def _push(self, m: _Message) -> None:
        heapq.heappush(self._heap, (m.visible_at, next(self._ids), m.message_id, m.receipt))

    def receive(self, max_messages: int = 10) -> list[Received]:
        now = time.monotonic()
        got: list[Received] = []
        with self._cond:
            while self._heap and len(got) < max_messages and self._heap[0][0] <= now:
                _at, _tie, message_id, receipt = heapq.heappop(self._heap)
                m = self._messages.get(message_id)
                if m is None or m.receipt != receipt:
                    continue  # deleted, or re-scheduled since this entry was pushed
                if not m.receives:
                    self.lags.append(now - m.visible_at)
                m.receipt += 1
                m.receives += 1
                m.visible_at = now + self.visibility_timeout
                self._push(m)
                got.append(Received(message_id, m.receipt, m.body, m.copy))
        return got

    def delete(self, message_id: str, receipt: int) -> None:
        with self._cond:
            m = self._messages.get(message_id)
            if m is not None and m.receipt == receipt:
                del self._messages[message_id]

    def make_visible(self, message_id: str, receipt: int) -> None:
        """ChangeMessageVisibility(0) for a received message."""
        with self._cond:
            m = self._messages.get(message_id)
            if m is not None and m.receipt == receipt:
                m.receipt += 1
                m.visible_at = time.monotonic()
                self._push(m)
                self._cond.notify_all()

    def expire_in_flight(self) -> None:
        """End the visibility timeout of every received, undeleted message now."""
        now = time.monotonic()
        with self._cond:
            for m in self._messages.values():
                if m.receives and m.visible_at > now:
                    m.receipt += 1
                    m.visible_at = now
                    self._push(m)
            self._cond.notify_all()

    def wait_visible(self, timeout: float) -> None:
        with self._cond:
            if self._heap:
                timeout = min(timeout, max(0.0, self._heap[0][0] - time.monotonic()))
            if timeout > 0:
                self._cond.wait(timeout)

    def lag(self) -> tuple[float, float, float]:
        """(p50, p95, max) seconds between a message's due time and its first delivery."""
        with self._cond:
            lags = sorted(self.lags) or [0.0]
        return lags[len(lags) // 2], lags[min(len(lags) - 1, int(len(lags) * 0.95))], lags[-1]

    def depth(self) -> int:
        with self._cond:
            return len(self._messages)


def virtual_poll_settings(clock: Any, *, sume_url: str, redis_url: str, prefix: str, budget: Any, max_age: int,
                          schedule: Any, discovery: Any) -> Any:
    """PollSettings for a Poller driven by hand on a virtual clock (figures 8 and 9): leases long
    enough that no real-time TTL runs out while the virtual clock races ahead."""
    from sume_poller.config.settings import Common, JobSettings, KeySettings, LeaseSettings, RedisSettings, SumeSettings
    from sume_poller.poll.poller import PollSettings

    return PollSettings(
        common=Common("unused", clock, True), poll_queue_url="memory://", event_bus_name="unused",
        result_bucket="unused", sume=SumeSettings(sume_url, "unused", "ssm"),
        redis=RedisSettings(redis_url, "standalone", None, prefix),
        lease=LeaseSettings(margin=3_600, claim_ttl=600, start_ttl=86_400), budget=budget,
        jobs=JobSettings(max_age=max_age), keys=KeySettings(), schedule=schedule, discovery=discovery)


class DetachedQueue(PollQueue):
    """A PollQueue with nothing behind it, for a Poller driven by hand: the poller reads only its
    delay limits (it hands each next message back in its Outcome); a send would be a bug."""

    def __init__(self, clock: Any) -> None:
        super().__init__("memory://detached", clock, sqs=_NoSqs())

    def _send_batch(self, chunk: list[Outgoing]) -> set[str]:
        raise AssertionError("a poller driven by hand sends nothing itself")


# -- the lease disabled ---------------------------------------------------------------------------


class NoLease(LeaseStore):
    """LeaseStore with the lease disabled: every start, rest and release succeeds, nothing is
    held. The client is real (fan-out keeps its cursor there)."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client, self.prefix = client, prefix

    def start(self, job_id: str, token: str, ttl_ms: int) -> bool:
        return True

    def start_many(self, starts: list[tuple[str, str]], ttl_ms: int) -> list[bool]:
        return [True] * len(starts)

    def rest(self, job_id: str, step: Step, ttl_ms: int) -> bool:
        return True

    def release(self, job_id: str, value: str) -> bool:
        return True


class NoLeaseGate(ReadGate):
    """The gate without the lease: every message claims its job (a message without a chain
    token starts a fresh chain); the read budget is taken as the real gate takes it."""

    def __init__(self, lease: NoLease, budget: Budget, pacer: LocalPacer) -> None:
        super().__init__(lease, budget, pacer, cluster=True)

    def enter(self, job_id: str, step: Step, fresh: Step, ttl_ms: int, *, mode: str = "take",
              max_wait: float = math.inf, slot: float = 0.0) -> Passage:
        claim = Claim.FRESH if step is fresh else Claim.OWN
        if self.budget.unlimited or mode == "none":
            return Passage(claim)
        return Passage(claim, self.budget.take(mode, max_wait, slot))


# -- counting adapters ------------------------------------------------------------------------------


class CountingStore(JobStore):
    """The real JobStore; counts terminal writes won per job (done = every job won once)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self.wins: Counter[str] = Counter()

    def record_terminal(self, job_id: str, outcome: Any, *, now: float, claim: Any = None) -> TerminalWrite:
        write = super().record_terminal(job_id, outcome, now=now, claim=claim)
        if write.won:
            with self._lock:
                self.wins[job_id] += 1
        return write

    def done(self) -> int:
        with self._lock:
            return len(self.wins)


def take_claim(record: dict[str, Any] | None, claim: Any, now: float) -> TerminalWrite:
    """A virtual store's publish claim on ``record`` (in place), as JobStore.claim_outbox's condition takes it."""
    if record is None or not record.get("event_pending") or float(record.get("chain_due_at") or 0) > now:
        return TerminalWrite(False, dict(record) if record else None)
    took_over = "event_claim" in record
    record.update(event_claim=claim.token, chain_due_at=claim.until)
    return TerminalWrite(True, dict(record), took_over)


def free_claim(record: dict[str, Any] | None, token: str) -> bool:
    """A virtual store's release of the publish claim ``token`` holds on ``record`` (JobStore.release_claim)."""
    if record is None or record.get("event_claim") != token or not record.get("event_pending"):
        return False
    del record["event_claim"]
    record["chain_due_at"] = 0
    return True


class CountingBus(EventBus):
    def __init__(self, bus_name: str = "default") -> None:
        super().__init__(bus_name)
        self._lock = threading.Lock()
        self.events: Counter[str] = Counter()

    def put_terminal(self, job_id: str, record: dict[str, Any]) -> None:
        super().put_terminal(job_id, record)
        with self._lock:
            self.events[job_id] += 1


def pacer_of(budget: Budget, settings: Any, share: int | None = None) -> LocalPacer:
    """The outage pacer a container builds for ``budget``."""
    return LocalPacer(budget.per_minute, budget.per_day, share or settings.budget.max_concurrency,
                      settings.common.clock.now)


def make_poller(settings: Any, *, lease: LeaseStore, budget: Budget, sume: Any, store: Any, bus: Any,
                queue: PollQueue, gate: ReadGate | None = None, cluster: bool = False, share: int | None = None,
                models: Any = None, coverage: Any = None) -> Poller:
    """The poll function's Poller on these parts, wired as :mod:`sume_poller.wiring.poll` wires it
    (models and sweep coverage: none by default)."""
    gate = gate or ReadGate(lease, budget, pacer_of(budget, settings, share), cluster=cluster)
    cadence = Cadence(settings, models=models, coverage=coverage, rate=budget.rate)
    return Poller(settings, gate=gate, sume=sume, store=store, bus=bus, queue=queue, cadence=cadence)


# -- crashes ------------------------------------------------------------------------------------------


class Crash(BaseException):
    """The Lambda process dying at a step: nothing after it runs, no batch response."""


#: Steps a crashing invocation picks from (the poller's step hooks, and the batch's "sent").
CRASH_STEPS = ("claimed", "read", "rested", "result", "written", "published", "released", "sent")


def crash_at(step: str) -> Callable[[str, str], None]:
    """A step hook raising :class:`Crash` the first time ``step`` is reached."""
    fired = threading.Lock()

    def hook(name: str, job_id: str) -> None:
        if name == step and fired.acquire(blocking=False):
            raise Crash(step)

    return hook


# -- the event source -----------------------------------------------------------------------------------


def sqs_record(m: Received, suffix: str = "") -> dict[str, Any]:
    return {"messageId": m.message_id + suffix, "receiptHandle": f"{m.message_id}:{m.receipt}", "body": m.body,
            "attributes": {}, "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:poll", "awsRegion": "us-east-1"}


@dataclass
class SourceStats:
    invocations: int = 0
    duplicates: int = 0
    crashes: Counter[str] = field(default_factory=Counter)
    fanouts: int = 0
    fanout_started: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


class EventSource:
    """Lambda's SQS event source over a :class:`MemQueue`: ``concurrency`` invocations at once, each
    of up to 10 messages through its own real BatchRunner. ``duplicate``: every message delivered
    twice (half the copies in the same batch, half 0-2 s later). ``crash_rate``: that share of
    invocations crash at a random step (the whole batch stays undeleted for the visibility
    timeout). ``fanout``: run every ``fanout_every`` s beside the invocations; ``feeder``: called
    every cycle (new jobs arriving), returns seconds until it has more, None when done."""

    def __init__(self, queue: MemQueue, make_runner: Callable[[], Any], *, duplicate: bool = False,
                 crash_rate: float = 0.0, fanout: Callable[[], Any] | None = None, fanout_every: float = 3.0,
                 feeder: Callable[[], float | None] | None = None, rng: random.Random | None = None,
                 concurrency: int = 3) -> None:
        self.queue, self.make_runner = queue, make_runner
        self.duplicate, self.crash_rate = duplicate, crash_rate
        self.fanout, self.fanout_every, self.feeder = fanout, fanout_every, feeder
        self.rng = rng or random.Random(0)
        self.concurrency = concurrency
        self.stats = SourceStats()
        self._lock = threading.Lock()

    def _deliver(self, runner: Any, messages: list[Received]) -> None:
        records = [sqs_record(m) for m in messages]
        hook = None
        with self._lock:
            if self.duplicate:
                for m in messages:
                    if not m.copy:
                        self.stats.duplicates += 1
                        if self.rng.random() < 0.5:
                            records.append(sqs_record(m, "-dup"))  # the same message twice in one batch
                        else:
                            self.queue.put(m.body, self.rng.uniform(0.0, 2.0), copy=True)  # again, later
            if self.crash_rate and self.rng.random() < self.crash_rate:
                hook = crash_at(self.rng.choice(CRASH_STEPS))
            self.stats.invocations += 1
        runner.step_hook = hook
        try:
            report = runner.run({"Records": records}, lambda: 30_000)
        except Crash as crash:
            with self._lock:
                self.stats.crashes[str(crash)] += 1
            return  # the process died: nothing deleted
        failed = {mid.removesuffix("-dup") for mid in report.failures}
        with self._lock:
            self.stats.outcomes.update(report.counts())
        for m in messages:
            if m.message_id in failed:
                self.queue.make_visible(m.message_id, m.receipt)
            else:
                self.queue.delete(m.message_id, m.receipt)

    def _workers(self, stop: threading.Event, errors: list[BaseException]) -> list[threading.Thread]:
        def loop() -> None:
            runner = self.make_runner()
            while not stop.is_set():
                messages = self.queue.receive(10)
                if not messages:
                    self.queue.wait_visible(0.05)
                    continue
                try:
                    self._deliver(runner, messages)
                except BaseException as exc:  # surfaced by the caller
                    errors.append(exc)
                    stop.set()

        threads = [threading.Thread(target=loop, name=f"bench-esm-{i}", daemon=True) for i in range(self.concurrency)]
        for thread in threads:
            thread.start()
        return threads

    def run(self, done: Callable[[], bool], timeout: float, *, schedule: bool = True) -> None:
        """Invocations (and, with ``schedule``, fan-out ticks and arrivals) until ``done()``."""
        stop, errors = threading.Event(), []  # type: ignore[var-annotated]
        threads = self._workers(stop, errors)
        deadline = time.monotonic() + timeout
        next_fanout = time.monotonic() + self.fanout_every
        try:
            while not done():
                if errors:
                    raise errors[0]
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not done after {timeout:.0f} s")
                wait = 0.05
                if schedule and self.fanout is not None and time.monotonic() >= next_fanout:
                    report = self.fanout()
                    self.stats.fanouts += 1
                    self.stats.fanout_started += report.started
                    next_fanout = time.monotonic() + self.fanout_every
                if schedule and self.feeder is not None:
                    more = self.feeder()
                    if more is None:
                        self.feeder = None
                    else:
                        wait = min(wait, more)
                stop.wait(wait)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        if errors:
            raise errors[0]

    def drain(self, timeout: float) -> None:
        """Deliver everything left, in-flight messages of crashed batches too, without crashes."""
        self.crash_rate = 0.0
        self.queue.expire_in_flight()
        self.run(lambda: self.queue.depth() == 0, timeout, schedule=False)


# -- Redis counters --------------------------------------------------------------------------------


class CallCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.n = 0

    def add(self, k: int = 1) -> None:
        with self._lock:
            self.n += k


def counting_client(url: str, counter: CallCounter) -> redis.Redis:
    """A standalone client like the layer's (``redisconn.connect``) whose round trips are
    counted client-side: one ``send_packed_command`` = one request written = one round trip."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    class CountingConnection(redis.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            counter.add()
            super().send_packed_command(command, check_health)

    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection, decode_responses=True,
                                         socket_timeout=2.0, retry=Retry(NoBackoff(), 1), max_connections=32)
    return redis.Redis(connection_pool=pool)


@dataclass(frozen=True)
class RedisSnapshot:
    reads: int
    commands: Counter[str]


class RedisCounter:
    """Server-side counters of one redis-server, or of every node of a cluster (``ports``).

    Round trips = the delta of ``total_reads_processed`` minus the one read of each closing
    ``INFO``. Commands = the ``commandstats`` delta without INFO (commands run inside Lua are
    counted there too: an EVALSHA of a script shows as evalsha + get + set)."""

    def __init__(self, ports: list[int]) -> None:
        self._nodes = [redis.Redis(host="127.0.0.1", port=p, decode_responses=True) for p in ports]

    def snapshot(self) -> RedisSnapshot:
        reads, commands = 0, Counter[str]()
        for node in self._nodes:
            info = node.execute_command("INFO", "stats", "commandstats")
            reads += int(info["total_reads_processed"])
            commands.update({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()
                             if k.startswith("cmdstat_") and k != "cmdstat_info"})
        return RedisSnapshot(reads, commands)

    def delta(self, before: RedisSnapshot, after: RedisSnapshot) -> tuple[int, Counter[str]]:
        commands = Counter(after.commands)
        commands.subtract(before.commands)
        return after.reads - before.reads - len(self._nodes), +commands


# -- logs ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def layer_logs_to(path: Path) -> Iterator[None]:
    """The layer's Powertools log lines go to ``path`` (not stdout, where the table goes) meanwhile."""
    from sume_poller.core.observability import logger

    with open(path, "a", encoding="utf-8") as log:
        previous = [(h, h.setStream(log)) for h in logger.handlers if hasattr(h, "setStream")]
        try:
            yield
        finally:
            for handler, stream in previous:
                handler.setStream(stream)
