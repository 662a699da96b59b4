"""Fan-out: start a chain for every pending job that has none, within the read budget.

Each scheduled tick:

1. the outbox partitions first: terminal jobs whose outbox is unfinished (say their message
   reached the dead-letter queue) get a message; the poll function finishes them without a
   Sume read (and without a read slot). An outbox whose publish claim is held (its record's
   ``chain_due_at`` ahead: the terminal write that just made it, or whoever took it over, is
   publishing) is left alone - that saves the message; publishing once rests on the claim itself
   (:mod:`sume_poller.poll.outbox`). An outbox that stays unfinished (EventBridge failing) is sent
   again only after doubling waits - one period, two, four... up to an hour - kept per job in
   Redis (``!outbox:<job_id>``: sends so far and when the next is due);
2. then, per Sume key (a :class:`Lane`: the key's own partitions of the pending index, its read
   budget and its cursor), the pending partitions from the cursor the last tick left in Redis, so
   under a backlog every partition is served in turn. Per page, one pipelined round trip tries to *start* a
   chain for each job (a free lease becomes the new chain's ``token:0``; a held lease means a
   chain is alive); started jobs get their first message, due now. A job whose chain runs
   without a lease (Redis was down: ``chain_due_at`` is ahead) is left to it;
3. it starts no more chains of a key than that key's read budget can serve before the next tick
   (a key whose budget binds never takes starts from another), and stops cleanly before its own
   timeout; the keys take turns at going first, so a short invocation serves each in turn.

4. per key, a drain of its create queue that died (:mod:`sume_poller.creates.drain`): a key whose queue
   holds submissions while its drain lease is free gets a new drain (its first message, due now).

While Redis is down it starts no chain (it cannot tell which jobs have one) but still sends
the outbox jobs. Every tick counts each key's pending jobs for its budget (the max-gap backstop
of the schedule's ordering and the sweeps' cost rule use it) and as the metric ``Pending`` per key.
A key the configuration no longer holds keeps a lane while its jobs are pending (its budget is
unlimited: no read is made for it - the poll function records each such job ``key_removed``).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, field
from typing import Any, ClassVar

from ..config.settings import BudgetSettings, FunctionSettings, safety_margin, schedule_period, setting
from ..core.clock import Clock
from ..core.jobs import KINDS, InvalidJobId, keyed_shard, validate_job_id
from ..core.messages import OUTBOX_PHASE, STATUS_PHASE, PollMessage
from ..core.observability import logger
from ..core.values import value
from ..creates.createqueue import DrainMessage, drain_lease
from ..limits.budget import Budget, Mode
from ..limits.lease import LeaseStore, new_token
from ..limits.redisconn import MISCONFIGURED, UNAVAILABLE, RedisFailure, describe, failure
from ..store.queue import SQS_BATCH, Outgoing, PollQueue
from ..store.records import JobStore


@value(kw_only=True)
class FanOutSettings(FunctionSettings):
    """The fan-out function's settings, read and validated once per container
    (:mod:`sume_poller.config.settings`)."""

    what: ClassVar[str] = "fan-out function"
    budget: BudgetSettings
    #: Between fan-out runs: it starts no more chains than the read budget can serve before the next.
    period: float = schedule_period("FANOUT_PERIOD_MINUTES")
    #: The create queue: fan-out restarts a key's drain that died (empty: none to restart).
    create_queue_url: str = setting("CREATE_QUEUE_URL", "")
    safety_margin_ms: int = safety_margin()

PAGE_SIZE = 100
#: Start batches in flight on the sender thread while the next page is read and leased: the tick's
#: SQS calls overlap its index reads and Redis round trips instead of following them.
SENDS_IN_FLIGHT = 2
#: The longest wait (clock seconds) before an unfinished outbox is sent again.
OUTBOX_BACKOFF_MAX = 3_600.0


@value(frozen=False, slots=False)
class FanOutReport:
    """What one fan-out tick did: pages read, chains started, outbox messages sent or backing off."""

    pages: int = 0
    outbox_sent: int = 0
    outbox_backing_off: int = 0
    #: Unfinished outboxes left alone this tick: their publish claim is held.
    outbox_claimed: int = 0
    started: int = 0
    leased: int = 0
    skipped_unleased_chain: int = 0
    skipped_invalid: int = 0
    send_failed: int = 0
    #: Drains of create queues restarted (a key's queue held submissions and no drain ran).
    drains_started: int = 0
    allowance: float = 0.0
    pending_counted: int | None = None
    #: Per Sume key: its pending jobs and the chains started for it this tick.
    pending_by_key: dict[str, int] = field(default_factory=dict)
    started_by_key: dict[str, int] = field(default_factory=dict)
    round_complete: bool = False
    stopped_early: bool = False
    redis_unavailable: bool = False
    redis_misconfigured: bool = False

    def as_dict(self) -> dict[str, Any]:
        unlimited = isinstance(self.allowance, float) and math.isinf(self.allowance)
        return {**asdict(self), "allowance": "unlimited" if unlimited else round(self.allowance, 1)}


@value(slots=False)
class Lane:
    """One Sume key's part of fan-out: its pending partitions, read budget and cursor."""

    key: str  # the key's id (metrics, logs)
    budget: Budget
    #: Redis prefix of the key's own state (its cursor).
    scope: str
    #: Whether its partitions and messages name it (every key but the default).
    named: bool = False

    def shard(self, shard: str) -> str:
        return keyed_shard(shard, self.key if self.named else None)


@value(frozen=False, slots=False)
class Cursor:
    """Where the last tick stopped in the pending partitions, kept in Redis between ticks, and the
    oldest submission seen so far in this round of them."""

    shard: int = 0
    key: dict[str, Any] | None = None
    oldest: float | None = None


class FanOut:
    """``budget``: the default key's read budget; ``lanes``: every key's (default: the default key's alone)."""

    def __init__(self, settings: FanOutSettings, store: JobStore, queue: PollQueue, lease: LeaseStore,
                 budget: Budget | None, remaining_ms: Callable[[], int], page_size: int = PAGE_SIZE, *,
                 lanes: list[Lane] | None = None, create_queue: PollQueue | None = None) -> None:
        self.s = settings
        self.clock: Clock = settings.common.clock
        self.store = store
        self.queue = queue
        self.lease = lease
        assert lanes or budget is not None, "a budget or lanes"
        self.lanes = lanes or [Lane(settings.keys.default_id, budget, lease.prefix)]  # type: ignore[arg-type]
        self.remaining_ms = remaining_ms
        self.create_queue = create_queue
        self.page_size = page_size
        self.report = FanOutReport()
        self.lane = self.lanes[0]
        #: Chains started (leases taken) whose first message is not sent yet: sent in full
        #: SendMessageBatch calls across pages, the rest when the lane ends.
        self._ready: list[tuple[dict[str, Any], str]] = []
        #: Their sends on the sender thread, oldest first: the messages (job id -> message, token) and
        #: the job ids SQS did not take. Each is settled on this thread (unsent: lease freed).
        self._in_flight: list[tuple[dict[str, tuple[PollMessage, str]], Future[set[str]]]] = []
        self._sender: ThreadPoolExecutor | None = None

    @property
    def budget(self) -> Budget:
        return self.lane.budget

    def run(self) -> FanOutReport:
        self._outbox()
        turn = int(self.clock.now() // max(self.s.period, 1.0)) % len(self.lanes)
        try:
            for lane in self.lanes[turn:] + self.lanes[:turn]:  # the keys take turns at going first
                self.lane = lane
                if not self._lane():
                    break
        finally:
            if self._sender is not None:  # every send was settled when its lane ended
                self._sender.shutdown()
        if self.create_queue is not None and not self.report.redis_unavailable:
            self._drains()
        return self.report

    def _drains(self) -> None:
        """Restart each key's drain that died: its queue holds submissions, its drain lease is free."""
        assert self.create_queue is not None
        for lane in self.lanes:
            if self._out_of_time():
                return
            if not self.store.queue_head(lane.key):
                continue
            token = new_token()
            try:
                if not self.lease.start(drain_lease(lane.key), token, self.s.lease.start_ttl * 1000):
                    continue  # a drain runs
            except RedisFailure as exc:
                logger.warning("drain not restarted (Redis)", extra=describe(exc))
                return
            message = DrainMessage(token, 0, lane.key if lane.named else None)
            if self.create_queue.send([Outgoing(lane.key, message.to_json(), 0.0)]):
                with contextlib.suppress(*RedisFailure):
                    self.lease.release(drain_lease(lane.key), f"{token}:0")
                self.report.send_failed += 1
                continue
            logger.warning("a drain of the create queue had died; restarted", extra={"key": lane.key})
            self.report.drains_started += 1

    def _lane(self) -> bool:
        """One key's chains; False when Redis cannot be asked (no key's chains can start)."""
        started = self.report.started
        try:
            allowance = self._allowance()
            self.report.allowance += allowance
            cursor = self._load_cursor()
        except RedisFailure as exc:
            kind = failure(exc)
            self.report.redis_unavailable = kind == UNAVAILABLE
            self.report.redis_misconfigured = kind == MISCONFIGURED
            logger.error(f"{kind}: fan-out starts no chain this tick", extra=describe(exc))
            self._count({})
            return False
        seen: dict[int, int] = {}
        try:
            self._pending(cursor, started + allowance, seen)
        finally:
            self._flush()
        self.report.started_by_key[self.lane.key] = self.report.started - started
        self._count(seen)
        return True

    @property
    def cursor_key(self) -> str:
        return f"{self.lane.scope}!fanout-cursor"

    def _count(self, seen: dict[int, int]) -> None:
        """The key's pending jobs, for its budget's day reserve and max-gap backstop and the sweeps'
        cost rule, told after the tick's starts (its own allowance used the count the last tick told).
        ``seen``: the partitions this tick read whole, with the records their pages held - a COUNT
        query of one would read the same records again (DynamoDB bills a COUNT by the data it reads);
        the others get one (a tick stopped by its allowance, one that found Redis down). A tick out of
        time leaves them uncounted rather than overrun: the budget keeps the last count."""
        shards = range(self.s.jobs.pending_shards)
        if any(i not in seen for i in shards) and self.remaining_ms() < self.s.safety_margin_ms:
            logger.warning("pending jobs not counted this tick (out of time)", extra={"key": self.lane.key})
            return
        count = sum(seen[i] if i in seen else self.store.count(self.lane.shard(f"p{i:02d}")) for i in shards)
        self.report.pending_by_key[self.lane.key] = count
        self.report.pending_counted = (self.report.pending_counted or 0) + count
        with contextlib.suppress(*RedisFailure):
            self.budget.mailbox.set_pending(count)

    # -- budget and cursor -------------------------------------------------------------------------
    def _allowance(self) -> float:
        """Chains the read budget can serve before the next tick: its rate times what is left of
        the period once the reads already reserved are served."""
        if self.budget.unlimited:
            return math.inf
        next_slot = self.budget.take(mode=Mode.PEEK)  # reads already reserved, pauses, the burst left
        if next_slot.key_paused:
            return 0.0
        return max(0.0, self.budget.rate * (self.s.period - next_slot.wait))

    def _load_cursor(self) -> Cursor:
        raw = self.lease.client.get(self.cursor_key)
        if not raw:
            return Cursor()
        try:
            data = json.loads(raw)
            oldest = data.get("oldest")
            return Cursor(int(data["shard"]) % self.s.jobs.pending_shards, data.get("key"),
                          float(oldest) if isinstance(oldest, int | float) else None)
        except (ValueError, KeyError, TypeError):
            logger.warning("fan-out cursor unreadable; starting a new round")
            return Cursor()

    def _save_cursor(self, cursor: Cursor) -> None:
        try:
            self.lease.client.set(self.cursor_key, json.dumps(asdict(cursor)), ex=7 * 86_400)
        except RedisFailure as exc:
            logger.warning("fan-out cursor not saved", extra={"error": type(exc).__name__})

    # -- the partitions ----------------------------------------------------------------------------
    def _out_of_time(self) -> bool:
        if self.remaining_ms() < self.s.safety_margin_ms:
            self.report.stopped_early = True
            return True
        return False

    def _outbox(self) -> None:
        for shard in range(self.s.jobs.pending_shards):
            start: dict[str, Any] | None = None
            while not self._out_of_time():
                items, start = self.store.pending_page(f"o{shard:02d}", start, self.page_size)
                self.report.pages += 1
                # No lease for these: the poller takes the publish claim and finishes the outbox, no Sume read.
                now = self.clock.now()
                valid = self._valid(items)
                free = [j for j in valid if float(j.get("chain_due_at") or 0) <= now]  # claimed: being published
                self.report.outbox_claimed += len(valid) - len(free)
                jobs = self._outbox_due(free)
                self.report.outbox_sent += self._send([(j, new_token()) for j in jobs], lease=False)
                if not start:
                    break

    def _outbox_due(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Of a page's unfinished outboxes, those due a message: one never sent at once, one sent
        before after its wait. Two pipelined round trips of plain GET/SET (cluster mode splits
        them by node); Redis down: all of them, as fan-out cannot tell."""
        if not jobs:
            return []
        keys = [f"{self.lease.prefix}!outbox:{j['job_id']}" for j in jobs]
        try:
            pipe = self.lease.client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
            marks = pipe.execute()
        except RedisFailure:
            return jobs
        now, due = self.clock.now(), []
        pipe = self.lease.client.pipeline(transaction=False)
        for job, key, mark in zip(jobs, keys, marks, strict=True):
            sends, _, next_at = str(mark or "0:0").partition(":")
            if now < float(next_at or 0):
                self.report.outbox_backing_off += 1
                continue
            wait = min(self.s.period * 2 ** min(int(sends), 16), OUTBOX_BACKOFF_MAX)
            pipe.set(key, f"{int(sends) + 1}:{now + wait:.3f}", ex=max(1, int(self.clock.to_real(2 * 86_400))))
            due.append(job)
        with contextlib.suppress(*RedisFailure):
            pipe.execute()
        return due

    def _pending(self, cursor: Cursor, allowance: float, seen: dict[int, int]) -> None:
        """Start the lane's chains until ``allowance`` (counting every lane's starts so far); ``seen``
        gets the record count of each partition read whole, from its first page to its last."""
        shards = self.s.jobs.pending_shards
        starts = allowance if math.isinf(allowance) else math.floor(allowance)
        for _ in range(shards):
            records = 0 if cursor.key is None else None  # None: the partition's head is not read here
            while True:
                if self._out_of_time() or self.report.started >= starts:
                    self._save_cursor(cursor)
                    return
                shard = self.lane.shard(f"p{cursor.shard:02d}")
                items, last = self.store.pending_page(shard, cursor.key, self.page_size)
                self.report.pages += 1
                records = None if records is None else records + len(items)
                now = self.clock.now()
                valid = self._valid(items)
                cursor.oldest = min([cursor.oldest or math.inf, *(float(j["submitted_at"]) for j in valid
                                                                   if isinstance(j.get("submitted_at"), int | float))])
                jobs = [j for j in valid if float(j.get("chain_due_at") or 0) <= now]
                self.report.skipped_unleased_chain += len(valid) - len(jobs)
                room = starts - self.report.started  # at least one start is left here
                if len(jobs) > room:  # stop inside this page: the next tick resumes after the last one started
                    jobs = jobs[:int(room)]
                    self._start_and_send(jobs)
                    cursor.key = {"pending_shard": {"S": self.lane.shard(f"p{cursor.shard:02d}")},
                                  "job_id": {"S": jobs[-1]["job_id"]}}
                    continue
                self._start_and_send(jobs)
                cursor.key = last
                if not last:
                    break
            if records is not None:
                seen[cursor.shard] = records
            cursor.shard = (cursor.shard + 1) % shards
            cursor.key = None
            if cursor.shard == 0:  # a whole round of the pending index: its oldest submission is known
                self.report.round_complete = True
                self._oldest_pending(cursor.oldest)
                cursor.oldest = None
        self._save_cursor(cursor)

    def _oldest_pending(self, oldest: float | None) -> None:
        """Tell the sweeps how far back a job of ours can be (none pending: now)."""
        with contextlib.suppress(*RedisFailure):
            self.budget.mailbox.set_oldest_pending(self.clock.now() if oldest is None or math.isinf(oldest) else oldest)

    def _start_and_send(self, jobs: list[dict[str, Any]]) -> None:
        """Start a chain for each job whose lease is free (one pipelined round trip); its first
        message goes out with the next full batch. A held lease means the job has a live chain."""
        if not jobs:
            return
        jobs = [{**j, "key": self.lane.key} if self.lane.named else j for j in jobs]  # messages name the key
        tokens = [new_token() for _ in jobs]
        taken = self.lease.start_many([(j["job_id"], t) for j, t in zip(jobs, tokens, strict=True)],
                                      self.s.lease.start_ttl * 1000)
        starts = [(j, t) for j, t, ok in zip(jobs, tokens, taken, strict=True) if ok]
        self.report.leased += len(jobs) - len(starts)
        self.report.started += len(starts)
        self._ready += starts
        if len(self._ready) >= SQS_BATCH:
            self._flush(len(self._ready) // SQS_BATCH * SQS_BATCH)

    def _flush(self, count: int | None = None) -> None:
        """Send the first ``count`` ready messages on the sender thread, at most SENDS_IN_FLIGHT
        batches ahead of this one; without ``count``, all of them, and wait until every send is
        settled (a lane ends with nothing in flight)."""
        batch = self._ready[:count]
        self._ready = self._ready[len(batch):]
        if batch:
            if len(self._in_flight) >= SENDS_IN_FLIGHT:
                self._settle(*self._in_flight.pop(0))
            messages = self._messages(batch, lease=True)
            self._sender = self._sender or ThreadPoolExecutor(max_workers=1, thread_name_prefix="fanout-send")
            self._in_flight.append((messages, self._sender.submit(self.queue.send, self._outgoing(messages))))
        while count is None and self._in_flight:
            self._settle(*self._in_flight.pop(0))

    def _settle(self, messages: dict[str, tuple[PollMessage, str]], sent: Future[set[str]]) -> None:
        """A start batch's send is done: the chains whose first message SQS did not take are not started
        (their leases freed: the next tick tries again)."""
        try:
            unsent = sent.result()
        except Exception:  # PollQueue.send reports what failed; anything else fails the whole batch
            unsent = set(messages)
        self._unsent(messages, unsent, lease=True)
        self.report.started -= len(unsent)

    def _messages(self, starts: list[tuple[dict[str, Any], str]], *, lease: bool) -> dict[str, tuple[PollMessage, str]]:
        """Each job's first message (job id -> message, token), due now."""
        now = self.clock.now()
        messages = {}
        for job, token in starts:
            submitted = job.get("submitted_at")
            msg = PollMessage(job_id=job["job_id"], kind=job["kind"], deadline_at=int(job["deadline_at"]),
                              due_at=round(now, 3), token=token, seq=0,
                              submitted_at=int(submitted) if isinstance(submitted, int | float) else None,
                              phase=STATUS_PHASE if lease else OUTBOX_PHASE, key=job.get("key") if lease else None)
            messages[job["job_id"]] = (msg, token)
        return messages

    @staticmethod
    def _outgoing(messages: dict[str, tuple[PollMessage, str]]) -> list[Outgoing]:
        return [Outgoing(job_id, m.to_json(), 0.0) for job_id, (m, _) in messages.items()]

    def _unsent(self, messages: dict[str, tuple[PollMessage, str]], unsent: set[str], *, lease: bool) -> None:
        """Messages SQS did not take: counted and logged; a start's lease is freed (the next tick tries again)."""
        for job_id in unsent if lease else ():
            with contextlib.suppress(*RedisFailure):
                self.lease.release(job_id, f"{messages[job_id][1]}:0")
        if unsent:
            logger.error("poll messages not sent; the next fan-out tick tries again", extra={"count": len(unsent)})
        self.report.send_failed += len(unsent)

    def _send(self, starts: list[tuple[dict[str, Any], str]], *, lease: bool) -> int:
        messages = self._messages(starts, lease=lease)
        unsent = self.queue.send(self._outgoing(messages))
        self._unsent(messages, unsent, lease=lease)
        return len(messages) - len(unsent)

    def _valid(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        jobs = []
        for item in items:
            try:
                validate_job_id(item.get("job_id"))
            except InvalidJobId as exc:
                self.report.skipped_invalid += 1
                logger.error("indexed record with an invalid job id skipped", extra={"reason": str(exc)})
                continue
            if item.get("kind") not in KINDS or not isinstance(item.get("deadline_at"), int):
                self.report.skipped_invalid += 1
                logger.error("indexed record without kind/deadline skipped", extra={"job_id": item.get("job_id")})
                continue
            jobs.append(item)
        return jobs
