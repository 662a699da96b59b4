"""Bench-only stand-ins and counters shared by the figures.

* :class:`MemQueue` - an in-process SQS queue (DelaySeconds, visibility timeout, receive up to
  10, delete, change visibility). It is the poll queue of figure 1: moto's SQS scans every
  message on every call, so a few hundred jobs in flight would throttle the event source and
  lag deliveries past the lease margin - that would measure moto, not the lease.
* :class:`EventSource` - plays Lambda's SQS event source mapping over a :class:`MemQueue`
  with the real batch handler (:func:`sume_poller.poller.handle_batch`): optional duplicate
  delivery, a fan-out tick and crashing invocations.
* :class:`NoLease` - LeaseStore's interface with the lease disabled (the baseline of figure 1).
* :class:`CountingJobStore` / :class:`CountingBus` - the real DynamoDB / EventBridge adapters,
  counting terminal writes won and terminal events per job.
* :class:`RedisCounter` - server-side round trips (``INFO stats``: ``total_reads_processed``)
  and commands (``INFO commandstats``) of one Redis server; :class:`CountingConnection` counts
  the client side (one ``send_packed_command`` = one request written = one round trip).
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from sume_poller.aws import EventBus, JobStore, TerminalWrite

# -- the poll queue -----------------------------------------------------------------------------


@dataclass
class QueuedMessage:
    message_id: str
    body: str
    visible_at: float
    receipt: int = 0
    receives: int = 0
    #: A bench-made duplicate (it is not duplicated again).
    copy: bool = False


@dataclass(frozen=True)
class Received:
    message_id: str
    receipt: int
    body: str
    copy: bool


class MemQueue:
    """An SQS standard queue in this process: what PollQueue needs (``send``/``send_batch``)
    plus what the event source needs. Times are ``time.monotonic()`` seconds."""

    def __init__(self, visibility_timeout: float = 180.0) -> None:
        self.visibility_timeout = visibility_timeout
        self._cond = threading.Condition()
        self._messages: dict[str, QueuedMessage] = {}
        self._heap: list[tuple[float, int, str, int]] = []  # (visible_at, tiebreak, id, receipt)
        self._ids = itertools.count(1)
        self.sends = 0
        self.batch_calls = 0
        #: Seconds each message waited past its due time before its first delivery (event source lag).
        self.lags: list[float] = []

    # -- PollQueue's interface ----------------------------------------------------------------
    def send(self, body: str, delay_seconds: int) -> None:
        self.put(body, float(delay_seconds))
        self.sends += 1

    def send_batch(self, entries: Sequence[tuple[str, str, int]]) -> list[str]:
        if len(entries) > 10:
            raise ValueError("SendMessageBatch takes at most 10 entries")
        self.batch_calls += 1
        for _id, body, delay in entries:
            self.put(body, float(delay))
        return []

    # -- the event source's side ------------------------------------------------------------------
    def put(self, body: str, delay: float, *, copy: bool = False) -> str:
        with self._cond:
            message_id = f"m{next(self._ids)}"
            message = QueuedMessage(message_id, body, time.monotonic() + delay, copy=copy)
            self._messages[message_id] = message
            self._push(message)
            self._cond.notify_all()
            return message_id

    def _push(self, message: QueuedMessage) -> None:
        heapq.heappush(self._heap, (message.visible_at, next(self._ids), message.message_id, message.receipt))

    def receive(self, max_messages: int = 10) -> list[Received]:
        now = time.monotonic()
        got: list[Received] = []
        with self._cond:
            while self._heap and len(got) < max_messages and self._heap[0][0] <= now:
                _at, _tie, message_id, receipt = heapq.heappop(self._heap)
                message = self._messages.get(message_id)
                if message is None or message.receipt != receipt:
                    continue  # deleted, or re-scheduled since this entry was pushed
                if not message.receives:
                    self.lags.append(now - message.visible_at)
                message.receipt += 1
                message.receives += 1
                message.visible_at = now + self.visibility_timeout
                self._push(message)
                got.append(Received(message_id, message.receipt, message.body, message.copy))
        return got

    def delete(self, message_id: str, receipt: int) -> None:
        with self._cond:
            message = self._messages.get(message_id)
            if message is not None and message.receipt == receipt:
                del self._messages[message_id]

    def make_visible(self, message_id: str, receipt: int) -> None:
        """ChangeMessageVisibility(0) for a received message."""
        with self._cond:
            message = self._messages.get(message_id)
            if message is not None and message.receipt == receipt:
                message.receipt += 1
                message.visible_at = time.monotonic()
                self._push(message)
                self._cond.notify_all()

    def expire_in_flight(self) -> int:
        """Fast-forward the visibility timeout of every received, undeleted message."""
        now = time.monotonic()
        with self._cond:
            n = 0
            for message in self._messages.values():
                if message.receives and message.visible_at > now:
                    message.receipt += 1
                    message.visible_at = now
                    self._push(message)
                    n += 1
            self._cond.notify_all()
            return n

    def wait_visible(self, timeout: float) -> None:
        """Block until a message may be visible, something is sent, or ``timeout`` passes."""
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

    def bodies(self) -> list[str]:
        with self._cond:
            return [m.body for m in self._messages.values()]

    def clear(self) -> None:
        with self._cond:
            self._messages.clear()
            self._heap.clear()


# -- lease disabled -----------------------------------------------------------------------------


class NoLease:
    """LeaseStore's interface, lease disabled: every acquire/renew succeeds, nothing is leased."""

    def __init__(self, prefix: str = "sume:poll:") -> None:
        self._prefix = prefix
        self.auth_pause_key = f"{prefix}!auth-paused"

    def key(self, job_id: str) -> str:
        return self._prefix + job_id

    def acquire(self, job_id: str, value: str, ttl_ms: int) -> bool:
        return True

    def acquire_unless_paused(self, job_id: str, value: str, ttl_ms: int) -> bool | None:
        return True

    def renew(self, job_id: str, expected: str, new_value: str, ttl_ms: int) -> bool:
        return True

    def release(self, job_id: str, expected: str) -> bool:
        return True

    def live(self, job_ids: Sequence[str]) -> tuple[bool, list[bool]]:
        return False, [False] * len(job_ids)

    def pause_auth(self, seconds: int) -> None:
        return None


# -- counting adapters ----------------------------------------------------------------------------


class CountingJobStore(JobStore):
    """The real JobStore; counts terminal writes won per job (done = every job won once)."""

    def __init__(self, table: str, ddb: Any = None) -> None:
        super().__init__(table, ddb)
        self._lock = threading.Lock()
        self.wins: Counter[str] = Counter()
        self.attempts = 0

    def record_terminal(self, job_id: str, status: str, **kwargs: Any) -> TerminalWrite:
        write = super().record_terminal(job_id, status, **kwargs)
        with self._lock:
            self.attempts += 1
            if write.won:
                self.wins[job_id] += 1
        return write

    def done(self) -> int:
        with self._lock:
            return len(self.wins)


class CountingBus(EventBus):
    def __init__(self, bus_name: str, events: Any = None) -> None:
        super().__init__(bus_name, events)
        self._lock = threading.Lock()
        self.events: Counter[str] = Counter()

    def put_terminal(self, detail: dict[str, Any]) -> None:
        super().put_terminal(detail)
        with self._lock:
            self.events[str(detail.get("job_id"))] += 1


class CaptureQueue:
    """PollQueue's interface; keeps every body sent (the chain's next messages)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: list[tuple[str, int]] = []
        self.batch_calls = 0

    def send(self, body: str, delay_seconds: int) -> None:
        with self._lock:
            self.sent.append((body, delay_seconds))

    def send_batch(self, entries: Sequence[tuple[str, str, int]]) -> list[str]:
        with self._lock:
            self.batch_calls += 1
            self.sent.extend((body, delay) for _i, body, delay in entries)
        return []

    def take(self) -> list[tuple[str, int]]:
        with self._lock:
            sent, self.sent = self.sent, []
            return sent


# -- crashes ---------------------------------------------------------------------------------------


class Crash(BaseException):
    """The Lambda process dying at a step: nothing after it runs, no batch response."""


#: Checkpoint steps a crashing invocation picks from (Poller._step names).
CRASH_STEPS = ("claimed", "read", "renewed", "requeued", "written", "published", "released")


def crash_checkpoint(step: str) -> Callable[[str, str], None]:
    """A Poller checkpoint raising :class:`Crash` the first time ``step`` is reached."""
    fired = threading.Lock()

    def checkpoint(name: str, job_id: str) -> None:
        if name == step and fired.acquire(blocking=False):
            raise Crash(step)

    return checkpoint


# -- the event source ---------------------------------------------------------------------------------


def sqs_record(message: Received, suffix: str = "") -> dict[str, Any]:
    return {"messageId": message.message_id + suffix, "receiptHandle": f"{message.message_id}:{message.receipt}",
            "body": message.body, "attributes": {}, "messageAttributes": {}, "md5OfBody": "",
            "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:poll",
            "awsRegion": "us-east-1"}


@dataclass
class SourceStats:
    invocations: int = 0
    records: int = 0
    failures: int = 0
    duplicates: int = 0
    crashes: Counter[str] = field(default_factory=Counter)
    crash_planned: int = 0
    fanouts: int = 0
    fanout_sent: int = 0
    fanout_seconds: list[float] = field(default_factory=list)


class EventSource:
    """Lambda's SQS event source over a :class:`MemQueue`, with the real batch handler.

    ``concurrency`` invocations run at once (the event source mapping's MaximumConcurrency),
    each receiving up to 10 messages. ``duplicate``: every message is delivered twice - half the
    copies in the same batch (they race each other), half re-sent to arrive 0-2 s later.
    ``crash_rate``: that share of invocations crash at a random step (:data:`CRASH_STEPS`); a
    crashed batch deletes nothing, so its messages stay in flight for the visibility timeout.
    ``fanout``: called every ``fanout_every`` seconds (the schedule), beside the invocations.
    """

    def __init__(self, queue: MemQueue, make_poller: Callable[[Callable[[str, str], None] | None], Any], *,
                 duplicate: bool = False, crash_rate: float = 0.0, fanout: Callable[[], Any] | None = None,
                 fanout_every: float | None = None, rng: random.Random | None = None,
                 after_batch: Callable[[], None] | None = None,
                 feeder: Callable[[], float | None] | None = None, concurrency: int = 3) -> None:
        self.queue = queue
        self.make_poller = make_poller
        self.duplicate = duplicate
        self.crash_rate = crash_rate
        self.fanout = fanout
        self.fanout_every = fanout_every
        self.rng = rng or random.Random(0)
        self.after_batch = after_batch
        #: Called every cycle (new jobs arriving); returns seconds until it has more, None when done.
        self.feeder = feeder
        self.concurrency = concurrency
        self.stats = SourceStats()
        self._lock = threading.Lock()  # rng and stats, shared by the invocation threads

    def deliver(self, messages: list[Received]) -> None:
        """One invocation of the poll function with these messages; delete what succeeded."""
        from sume_poller.poller import handle_batch

        records = [sqs_record(m) for m in messages]
        checkpoint = None
        with self._lock:
            if self.duplicate:
                for m in messages:
                    if m.copy:
                        continue
                    self.stats.duplicates += 1
                    if self.rng.random() < 0.5:
                        records.append(sqs_record(m, "-dup"))  # the same message twice in one batch
                    else:
                        self.queue.put(m.body, self.rng.uniform(0.0, 2.0), copy=True)  # again, later
            if self.crash_rate and self.rng.random() < self.crash_rate:
                self.stats.crash_planned += 1
                checkpoint = crash_checkpoint(self.rng.choice(CRASH_STEPS))
            self.stats.invocations += 1
            self.stats.records += len(records)
        try:
            reply = handle_batch({"Records": records}, lambda: 30_000, self.make_poller(checkpoint))
        except Crash as crash:
            with self._lock:
                self.stats.crashes[str(crash)] += 1
            return  # the process died: nothing deleted, the batch waits out its visibility timeout
        finally:
            if self.after_batch:
                self.after_batch()
        failed = {f["itemIdentifier"].removesuffix("-dup") for f in reply.get("batchItemFailures", [])}
        with self._lock:
            self.stats.failures += len(failed)
        for m in messages:
            if m.message_id in failed:
                self.queue.make_visible(m.message_id, m.receipt)  # fast retry, like LocalSystem
            else:
                self.queue.delete(m.message_id, m.receipt)

    def _tick(self, next_fanout: float) -> float:
        if self.fanout is None or self.fanout_every is None or time.monotonic() < next_fanout:
            return next_fanout
        started = time.monotonic()
        report = self.fanout()
        self.stats.fanout_seconds.append(time.monotonic() - started)
        self.stats.fanouts += 1
        self.stats.fanout_sent += int(getattr(report, "sent", 0))
        return time.monotonic() + self.fanout_every

    def _invocations(self, stop: threading.Event, errors: list[BaseException]) -> list[threading.Thread]:
        def loop() -> None:
            while not stop.is_set():
                messages = self.queue.receive(10)
                if not messages:
                    self.queue.wait_visible(0.05)
                    continue
                try:
                    self.deliver(messages)
                except BaseException as exc:  # surfaced by the caller
                    errors.append(exc)
                    stop.set()

        threads = [threading.Thread(target=loop, name=f"bench-esm-{i}", daemon=True) for i in range(self.concurrency)]
        for thread in threads:
            thread.start()
        return threads

    def _run(self, done: Callable[[], bool], timeout: float, what: str, schedule: bool) -> None:
        stop, errors = threading.Event(), []  # type: ignore[var-annotated]
        threads = self._invocations(stop, errors)
        deadline = time.monotonic() + timeout
        next_fanout = time.monotonic() + (self.fanout_every or 0.0)
        try:
            while not done():
                if errors:
                    raise errors[0]
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what} after {timeout:.0f} s")
                wait = 0.05
                if schedule:
                    next_fanout = self._tick(next_fanout)
                    feed_in = self.feeder() if self.feeder else None
                    if feed_in is None:
                        self.feeder = None
                    else:
                        wait = min(wait, feed_in)
                stop.wait(wait)  # the invocation threads do the work meanwhile
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        if errors:
            raise errors[0]

    def run_until(self, done: Callable[[], bool], timeout: float) -> None:
        """Run the invocations, the schedule and the arrivals until ``done()`` (TimeoutError at the deadline)."""
        self._run(done, timeout, "not done", schedule=True)

    def drain(self, timeout: float) -> None:
        """Deliver everything left (in-flight messages of crashed batches too, their visibility
        timeout fast-forwarded) until the queue is empty. No more crashes while draining."""
        crash_rate, self.crash_rate = self.crash_rate, 0.0
        try:
            self.queue.expire_in_flight()
            self._run(lambda: self.queue.depth() == 0, timeout, "queue not drained", schedule=False)
        finally:
            self.crash_rate = crash_rate


class ObservingSume:
    """The real SumeClient; remembers the status each read saw, per job, to count redundant reads:
    a status read that sees the same status as the job's previous read learnt nothing new."""

    def __init__(self, sume: Any) -> None:
        self._sume = sume
        self._lock = threading.Lock()
        self._last: dict[str, str] = {}
        self.redundant: Counter[str] = Counter()

    def get_status(self, job_id: str) -> Any:
        from sume_poller.sume import Pending, Terminal

        reply = self._sume.get_status(job_id)
        seen = reply.status if isinstance(reply, Pending) else (
            f"terminal:{reply.sume_status}" if isinstance(reply, Terminal) else None)
        if seen is not None:
            with self._lock:
                if self._last.get(job_id) == seen:
                    self.redundant[job_id] += 1
                self._last[job_id] = seen
        return reply

    def get_result(self, job_id: str) -> Any:
        return self._sume.get_result(job_id)


# -- Redis counters --------------------------------------------------------------------------------


class CallCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.n = 0

    def add(self, k: int = 1) -> None:
        with self._lock:
            self.n += k


def counting_connection_class(counter: CallCounter) -> type[redis.Connection]:
    class CountingConnection(redis.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            counter.add()
            super().send_packed_command(command, check_health)

    return CountingConnection


def counting_client(url: str, counter: CallCounter, **kwargs: Any) -> redis.Redis:
    """A Redis client like ``runtime.redis_client()`` whose round trips are counted client-side."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    options: dict[str, Any] = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0, "retry": Retry(NoBackoff(), 1),
                               "health_check_interval": 30, "decode_responses": True, "max_connections": 32}
    options.update(kwargs)
    pool = redis.ConnectionPool.from_url(url, connection_class=counting_connection_class(counter), **options)
    return redis.Redis(connection_pool=pool)


@dataclass(frozen=True)
class RedisSnapshot:
    reads: int
    commands: dict[str, int]


class RedisCounter:
    """Server-side counters of one Redis server, read with one ``INFO stats commandstats``.

    Round trips = the delta of ``total_reads_processed`` (read events: one per request on a
    connection, a pipeline arriving in one read) minus the one read of the closing INFO itself.
    Commands = the ``commandstats`` delta without INFO (commands run inside Lua are counted there
    too: an EVALSHA of the renew script shows as evalsha + get + set).
    """

    def __init__(self, url: str) -> None:
        self._r = redis.Redis.from_url(url, decode_responses=True)

    def snapshot(self) -> RedisSnapshot:
        info = self._r.execute_command("INFO", "stats", "commandstats")
        commands = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()
                    if k.startswith("cmdstat_") and k != "cmdstat_info"}
        return RedisSnapshot(int(info["total_reads_processed"]), commands)

    @staticmethod
    def delta(before: RedisSnapshot, after: RedisSnapshot) -> tuple[int, dict[str, int]]:
        commands = {k: v - before.commands.get(k, 0) for k, v in after.commands.items()
                    if v != before.commands.get(k, 0)}
        return after.reads - before.reads - 1, commands
