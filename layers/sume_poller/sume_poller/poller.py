"""The poll step: one SQS message of a job's chain, at most one Sume read (two: a status read
that finds the job completed and ready is followed by its result read).

For each message (step ``n`` of chain ``T``)::

    gate: claim the lease and take a read slot      (one Redis round trip, see gate.py)
      held by another chain / a duplicate       -> drop quietly
      lease was free                            -> new chain; read the record: finished? finish its outbox
                                                   (no read slot taken) or drop; else take a slot
    past the deadline                           -> record timed_out
    not due yet (SQS waits at most 900 s)       -> hop: re-queue toward the due time, no read
    no read slot now                            -> re-queue for the reserved slot (keeping the lease)
    status phase: GET /jobs/{id}
      running / transient fault / 404 in its grace window -> rest the lease, re-queue at the next read time
      failed, canceled, expired                 -> the terminal write
      completed, result_ready false             -> result phase: wait, reading the status (Sume's gate)
      completed (result ready, or no gate)      -> GET /jobs/{id}/result at once
      401 (the key)                             -> pause every read key-wide, re-queue after the pause
      403                                       -> the job's workspace (record failed) unless a key check says the key
    result phase: GET /jobs/{id}/result         -> the terminal write with the result (inline, or streamed to S3)
      not there (404/409/425)                   -> a job only a list/webhook called finished: its status read;
                                                   else wait (result-phase backoff) until the deadline
    terminal write (conditional, once) -> outbox: observation, result object, event, done; release the lease

Only the job's own routes make it terminal: what a sweep's list or a webhook says is confirmed by
a status read (failures) or by the result itself (completed jobs) before anything is recorded.

While Redis is unreachable the lease is replaced by a fence on the job record (one chain step
may read once: duplicates do not read twice) and the budget by this container's outage pacer
(:class:`~sume_poller.budget.LocalPacer`): jobs keep moving, on their own schedule and deadline.
A Redis that answers but refuses a command is a misconfiguration, counted apart
(:mod:`sume_poller.redisconn`).

A step returns an :class:`Outcome`; the next message is not sent here but handed back
(``Outcome.send``), so the batch adapter sends a whole batch's re-queues together.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from .aws import AwsError
from .budget import Budget, Grant, LocalPacer, RateInfo
from .clock import Clock
from .coverage import CoverageView, is_canary
from .events import EventBus
from .gate import ReadGate
from .jobs import PENDING, error_delay, result_wait_delay
from .lease import Claim, LeaseStore, Step, new_nonce, new_token, resting_value
from .messages import OUTBOX_PHASE, RESULT_PHASE, STATUS_PHASE, PollMessage
from .observability import logger
from .queue import Outgoing, PollQueue
from .redisconn import UNAVAILABLE, Breaker, RedisFailure, describe, failure, reconnect
from .schedule import DEFAULT_W0, Bounds, defer_delay, max_wait, next_delay, overdue, read_priority
from .settings import PollSettings
from .store import INLINE_RESULT_BYTES, Ending, JobStore
from .sume import (
    BodyTooLarge,
    Oversized,
    Pending,
    Refused,
    Result,
    ResultStream,
    Retryable,
    StreamTimeout,
    SumeClient,
    Terminal,
)

#: A message this close to its due time (clock seconds) is read now rather than hopped again.
HOP_TOLERANCE = 0.1
#: Real seconds a Sume call needs at least, and the time kept after it for the steps that
#: follow (lease, terminal write, event): a record with less left does not start a read.
MIN_READ_REAL = 1.0
AFTER_READ_REAL = 3.0
#: How long a rejected key pauses every read (clock seconds), and how long a key check holds.
KEY_PAUSE = 300.0
KEY_CHECK_TTL = 60.0
#: The farthest read slot (clock seconds) a key check waits for in the invocation; past it the job
#: asks again later.
KEY_CHECK_WAIT = 2.0
#: While Redis is down, a step waiting for its outage-pacer slot comes back at least this often
#: (clock seconds): once Redis answers again it reads at its own due time, not the pacer's.
PACED_HOP = 30.0
#: Hooks for the fault suite: called after each named step with (step, job_id).
STEPS = ("claimed", "read", "rested", "result", "written", "published", "released")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one message did. ``send`` is the chain's next message, for the batch to send;
    ``undo`` frees the lease if that send fails (so SQS's redelivery can take over)."""

    name: str
    status_reads: int = 0
    result_reads: int = 0
    status: str | None = None
    send: Outgoing | None = None
    undo: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    failed: bool = False
    signals: tuple[str, ...] = ()

    @property
    def reads(self) -> int:
        return self.status_reads + self.result_reads


class Deadline:
    """The real time one record's work may take (the invocation's, less a safety margin)."""

    def __init__(self, seconds: float, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._end = now() + seconds

    def left(self) -> float:
        return self._end - self._now()

    def call_budget(self) -> float:
        """Real seconds a Sume call may take and still leave time for what follows it."""
        return max(0.05, self.left() - AFTER_READ_REAL)


class Hold(Protocol):
    """What the state machine needs of whatever keeps other pollers off the job."""

    def rest(self, chain: PollMessage, due: float, ttl_real: float) -> bool: ...
    def release(self) -> None: ...
    def undo_rest(self) -> None: ...


class LeaseHold:
    """The job's Redis lease, held by one step of a chain."""

    def __init__(self, lease: LeaseStore, job_id: str, step: Step) -> None:
        self.lease, self.job_id, self.step = lease, job_id, step
        self._rested = step.next_resting

    def rest(self, chain: PollMessage, due: float, ttl_real: float) -> bool:
        # A step that fetches the result of a job Sume finished rests as a finishing step ("*"):
        # no sweep or webhook hands it over again, so it keeps its reserved read slot. A status
        # step that reserved a slot says so in the lease: a hand-over passes the slot on.
        finishing = chain.phase == RESULT_PHASE
        self._rested = resting_value(self.step, finishing, chain.slot_at)
        try:
            return self.lease.rest(self.job_id, self.step, max(1, int(ttl_real * 1000)), finishing=finishing,
                                   slot=chain.slot_at)
        except RedisFailure as exc:  # keep the chain going: its next message re-takes the lease
            logger.warning("lease rest failed (Redis); re-queueing anyway", extra=describe(exc))
            return True

    def release(self) -> None:
        self._release(self.step.claimed)

    def undo_rest(self) -> None:
        self._release(self._rested)

    def _release(self, value: str) -> None:
        try:
            self.lease.release(self.job_id, value)
        except RedisFailure as exc:  # it expires on its own
            logger.warning("lease release failed; it will expire", extra=describe(exc))


class NoHold:
    """Nothing to hold: an outbox message touches no lease."""

    def rest(self, chain: PollMessage, due: float, ttl_real: float) -> bool:
        return True

    def release(self) -> None:
        pass

    def undo_rest(self) -> None:
        pass


class FenceHold:
    """While Redis is down: the fence on the job record; the chain's next due time is kept there
    too, so fan-out does not start a second chain once Redis is back."""

    def __init__(self, store: JobStore, job_id: str, margin: float) -> None:
        self.store, self.job_id, self.margin = store, job_id, margin

    def rest(self, chain: PollMessage, due: float, ttl_real: float) -> bool:
        self.store.set_chain_due(self.job_id, due + self.margin)
        return True

    def release(self) -> None:
        pass

    def undo_rest(self) -> None:
        pass


class Poller:
    def __init__(self, settings: PollSettings, *, gate: ReadGate, budget: Budget, pacer: LocalPacer,
                 sume: SumeClient, store: JobStore, bus: EventBus, queue: PollQueue,
                 models: Callable[[str, str], Any] | None = None, coverage: CoverageView | None = None,
                 step_hook: Callable[[str, str], None] | None = None, rng: random.Random | None = None,
                 breaker: Breaker | None = None) -> None:
        self.s = settings
        self.clock: Clock = settings.common.clock
        self.gate = gate
        self.lease = gate.lease
        self.budget = budget
        self.pacer = pacer
        self.sume = sume
        self.store = store
        self.bus = bus
        self.queue = queue
        self.models = models or (lambda profile, kind: None)
        #: What sweeps proved and whether webhooks arrive: covered kinds stretch to the safety cadence.
        self.coverage = coverage if settings.discovery.sweeps or settings.discovery.webhook_kinds else None
        self.bounds = Bounds(settings.schedule.min_interval, settings.schedule.max_interval,
                             settings.schedule.age_fraction)
        #: Test seam: called after each step in STEPS; the fault suite raises from it to crash there.
        self.step_hook = step_hook
        self.rng = rng or random.Random()
        self.breaker = breaker or Breaker()
        self._key_ok_until = 0.0
        self._last_ok_job: str | None = None
        #: Pending jobs as fan-out last counted them (the limiter passes it on): the backstop's scale.
        self._pending: int | None = None

    def _step(self, name: str, job_id: str) -> None:
        if self.step_hook is not None:
            self.step_hook(name, job_id)

    # -- entry ----------------------------------------------------------------------------------
    def process(self, msg: PollMessage, deadline: Deadline) -> Outcome:
        now = self.clock.now()
        if deadline.left() < MIN_READ_REAL + AFTER_READ_REAL:
            # Not enough of the invocation left to finish a step: the same message goes back.
            return Outcome("out_of_time", send=Outgoing(msg.job_id, msg.to_json(), 0.0))
        if msg.phase == OUTBOX_PHASE:  # fan-out's: the record says what is left; no lease, no read
            return self._not_pending(msg.job_id, self.store.get(msg.job_id), NoHold())
        if msg.normal_due is not None and not self._stretches(msg.kind, msg.job_id, now):
            msg = msg.next(due_at=min(msg.due_at, msg.normal_due))  # no longer covered: the normal schedule
        elif self._first_read_covered(msg, now):
            # Sweeps or webhooks cover the kind from the start: the first read waits for the safety
            # cadence too (hopping every SweepCheckSeconds to check the cover still holds).
            stretched = (msg.submitted_at or now) + self.s.discovery.safety
            msg = msg.next(due_at=round(max(msg.due_at, stretched), 3), normal_due=round(msg.due_at, 3))
        due = min(msg.due_at, float(msg.deadline_at))
        hop = due - now if due - now > HOP_TOLERANCE else None
        nonce = new_nonce()
        step = Step(msg.token, msg.seq, nonce) if msg.token else None
        fresh = Step(new_token(), 0, nonce)
        ttl = self.clock.to_real(min(hop, self.queue.max_delay)) + self.s.lease.margin if hop else \
            float(self.s.lease.claim_ttl)
        # A message that reserved its slot confirms it; a read of a job known to be finished (its
        # result, or the status read that confirms a list's or webhook's word) goes ahead in line.
        mode = "none" if hop else (
            ("rconfirm" if msg.phase == RESULT_PHASE else "confirm") if msg.slot_at is not None else
            "ahead" if msg.phase == RESULT_PHASE else "take")
        patience = self._patience(msg, now) if mode == "take" else math.inf
        if self.breaker.open:
            return self._unleased(msg, hop, deadline, UNAVAILABLE)
        try:
            passage = self.gate.enter(msg.job_id, step or fresh, fresh, max(1, int(ttl * 1000)), mode=mode,
                                      max_wait=patience, slot=msg.slot_at or 0.0)
        except RedisFailure as exc:
            return self._unleased(msg, hop, deadline, self._redis_failed(exc, "polling without the lease"))
        self._learn(passage.grant)
        if passage.claim is Claim.HELD:
            logger.info("another chain or delivery holds the job; message dropped", extra={"seq": msg.seq})
            return Outcome("contention")
        held = step if passage.claim is Claim.OWN and step else fresh
        hold = LeaseHold(self.lease, msg.job_id, held)
        self._step("claimed", msg.job_id)
        chain = msg.next(token=held.token, seq=held.seq, paced_at=None)
        grant = passage.grant
        if passage.claim is Claim.FRESH:
            # The lease was free: the record says whether the job still needs a read (an outbox to
            # finish needs none), and only then is a read slot taken.
            record = self.store.get(msg.job_id)
            if record is None or record.get("status") != PENDING:
                return self._not_pending(msg.job_id, record, hold)
            chain = _refresh(chain, record)
            if mode != "none":
                grant = self._take_slot(mode, patience, msg.slot_at or 0.0)
        return self._advance(chain, hold, grant, hop, deadline)

    def _unleased(self, msg: PollMessage, hop: float | None, deadline: Deadline, signal: str) -> Outcome:
        """Redis is unreachable: the job's record fences its chain (one read per step), and this
        container's outage pacer replaces the shared budget. A step waiting for its pacer slot
        carries it (``paced_at``) and reads then without reserving again; if Redis is back by
        then, it reads through the gate at its own due time instead."""
        chain = msg if msg.token else msg.next(token=new_token(), seq=0)
        hold = FenceHold(self.store, msg.job_id, self.clock.from_real(self.s.lease.margin))
        signals = (signal,)
        now = self.clock.now()
        if hop is None and now < chain.deadline_at:
            # The fence first: a duplicate of this step stops here, before it could take a slot.
            fence = self.store.fence(chain.job_id, chain.token or "", chain.seq, now=now,
                                     hold=self.clock.from_real(self.s.lease.claim_ttl))
            if not fence.won:
                return _with_signals(self._not_pending(chain.job_id, fence.record, hold, duplicate=True), signals)
            wait = chain.paced_at - now if chain.paced_at is not None else self.pacer.take()
            if wait > self.budget.early:
                return self._requeue(chain, hold, due=now, name="budget_wait", paced_at=round(now + wait, 3),
                                     signals=signals)
            chain = chain.next(paced_at=None)
        return _with_signals(self._advance(chain, hold, None, hop, deadline), signals)

    # -- the state machine ------------------------------------------------------------------------
    def _advance(self, chain: PollMessage, hold: Hold, grant: Grant | None, hop: float | None,
                 deadline: Deadline) -> Outcome:
        now = self.clock.now()
        if now >= chain.deadline_at:
            return self._timed_out(chain, hold)
        if hop is not None:
            return self._requeue(chain, hold, due=chain.due_at, name="hopped", slot_at=chain.slot_at)
        if grant is not None and not grant.now:
            return self._wait_for_slot(chain, hold, grant)
        if deadline.left() < MIN_READ_REAL + AFTER_READ_REAL:
            return self._requeue(chain, hold, due=now, name="out_of_time")
        facts = chain.outcome or {}
        if chain.phase == RESULT_PHASE and (facts.get("status") != "completed" or facts.get("result_ready") is False):
            # Only the job's own routes make it terminal: a failure a list or webhook reported is
            # confirmed by its status read; a result Sume said is not ready is waited for on the status.
            return self._read_status(chain.next(phase=STATUS_PHASE, outcome=None), hold, deadline)
        if chain.phase == RESULT_PHASE:
            return self._fetch_result(chain, hold, deadline)
        return self._read_status(chain, hold, deadline)

    def _wait_for_slot(self, chain: PollMessage, hold: Hold, grant: Grant) -> Outcome:
        now = self.clock.now()
        if grant.granted:
            at = now + grant.wait
            return self._requeue(chain, hold, due=at, name="budget_wait", slot_at=at,
                                 signals=("KeyPaused",) if grant.key_paused else ("BudgetExhausted",))
        if grant.key_paused:
            return self._requeue(chain, hold, due=now + grant.wait + self.rng.uniform(0, 30), name="key_paused",
                                 signals=("KeyPaused",))
        model, age, last, _ = self._position(chain, now)
        delay = defer_delay(model, last, age, grant.wait, DEFAULT_W0, self.bounds)
        return self._requeue(chain, hold, due=now + delay, name="deferred")

    def _read_status(self, chain: PollMessage, hold: Hold, deadline: Deadline) -> Outcome:
        reply = self.sume.get_status(chain.job_id, budget=deadline.call_budget())
        now = self.clock.now()
        self._step("read", chain.job_id)
        self._tell_budget(reply.rate)
        chain = chain.next(reads=chain.reads + 1, slot_at=None)
        if isinstance(reply, Pending):
            self._last_ok_job = chain.job_id
            signals = ("UnknownStatus",) if reply.unknown_status else ()
            if reply.unknown_status:
                logger.warning("unknown Sume status; treating it as not terminal",
                               extra={"sume_status": reply.status, "request_id": reply.request_id})
            due = now + self._next_delay(chain, now, reply.next_poll_after)
            if self._stretches(chain.kind, chain.job_id, now):
                return self._requeue(chain, hold, due=max(due, now + self.s.discovery.safety), name="stretched",
                                     status_reads=1, errors=0, seen_running_at=now, normal_due=round(due, 3),
                                     found_by=None, signals=signals)
            return self._requeue(chain, hold, due=due, name="requeued", status_reads=1, errors=0,
                                 seen_running_at=now, normal_due=None, found_by=None, signals=signals)
        if isinstance(reply, Retryable):
            return self._transient(chain, hold, reply, status_reads=1)
        if isinstance(reply, Refused):
            return self._refused(chain, hold, reply, deadline, status_reads=1)
        return self._terminal(chain, hold, reply, now, deadline)

    def _terminal(self, chain: PollMessage, hold: Hold, reply: Terminal, now: float, deadline: Deadline) -> Outcome:
        self._last_ok_job = chain.job_id
        if self.coverage is not None and self.s.discovery.sweeps and chain.phase != RESULT_PHASE:
            try:  # what proves (or disproves) sweeps' coverage
                self.coverage.store.found(chain.kind, chain.job_id, now)
            except RedisFailure as exc:
                kind = self._redis_failed(exc, "the find was not kept for sweeps to judge")
                return _with_signals(self._terminal_read(chain, hold, reply, now, deadline), (kind,))
        return self._terminal_read(chain, hold, reply, now, deadline)

    def _terminal_read(self, chain: PollMessage, hold: Hold, reply: Terminal, now: float,
                       deadline: Deadline) -> Outcome:
        outcome: dict[str, Any] = {"status": reply.status, "sume_status": reply.sume_status, "error": reply.error,
                                   "source": "status", "result_ready": reply.result_ready if reply.gated else None}
        chain = chain.next(seen_terminal_at=chain.seen_terminal_at or now, errors=0,
                           outcome={k: v for k, v in outcome.items() if v is not None})
        if reply.status != "completed":
            return self._finish(chain, hold, reply.status, reply.sume_status, reply.error, status_reads=1)
        chain = chain.next(phase=RESULT_PHASE)
        if not reply.result_ready:  # Sume's gate: the wait reads the status until it opens
            wait = max(reply.next_poll_after or 0.0, result_wait_delay(chain.result_waits, self.rng))
            return self._requeue(chain, hold, due=now + wait, name="result_not_ready", status_reads=1,
                                 result_waits=chain.result_waits + 1, signals=("ResultNotReady",))
        # The result at once, if the job may still be read and the invocation has time for it.
        if now >= chain.deadline_at:
            return _counted(self._timed_out(chain, hold), status_reads=1)
        if deadline.left() < MIN_READ_REAL + AFTER_READ_REAL:
            return self._requeue(chain, hold, due=now, name="out_of_time", status_reads=1)
        grant = self._take_slot("ahead")
        if grant is not None and not grant.now:
            return _counted(self._wait_for_slot(chain, hold, grant), status_reads=1)
        return _counted(self._fetch_result(chain, hold, deadline), status_reads=1)

    def _fetch_result(self, chain: PollMessage, hold: Hold, deadline: Deadline) -> Outcome:
        reply = self.sume.get_result(chain.job_id, budget=deadline.call_budget(), inline_limit=INLINE_RESULT_BYTES,
                                     time_left=lambda: deadline.left() - AFTER_READ_REAL)
        now = self.clock.now()
        self._step("result", chain.job_id)
        self._tell_budget(reply.rate)
        chain = chain.next(result_reads=chain.result_reads + 1, slot_at=None)
        facts = chain.outcome or {"status": "completed"}
        if isinstance(reply, Result | ResultStream | Oversized):
            try:
                stored = self._store_result(chain.job_id, reply)
            except (StreamTimeout, *AwsError) as exc:
                logger.warning("result not stored; fetching it again", extra={"error": type(exc).__name__})
                return self._transient(chain, hold, Retryable("result_not_stored"), result_reads=1)
            return self._finish(chain, hold, "completed", facts.get("sume_status"), stored.pop("error", None),
                                result=stored, result_reads=1)
        if isinstance(reply, Refused) and reply.why in ("key", "forbidden"):
            return self._refused(chain, hold, reply, deadline, result_reads=1)
        if _not_there(reply):
            return self._result_not_there(chain, hold, reply, now)
        if isinstance(reply, Refused):
            return self._finish(chain, hold, "completed", facts.get("sume_status"),
                                {"code": reply.code or f"http_{reply.http_status}",
                                 "message": reply.message or "Sume refused the result"}, result_reads=1)
        return self._transient(chain, hold, reply, result_reads=1)

    def _store_result(self, job_id: str, reply: Result | ResultStream | Oversized) -> dict[str, Any]:
        """The record fields of a fetched result: inline, in S3, or ``result_too_large``."""
        if isinstance(reply, Result):
            return self.store.result_fields(job_id, reply.payload)
        limit = self.sume.result_max_bytes
        if isinstance(reply, ResultStream) and self.store.results is not None:
            with reply:
                try:
                    return self.store.results.upload(job_id, reply)
                except BodyTooLarge as exc:
                    size = exc.size
        else:
            size = reply.size if isinstance(reply, Oversized) else (reply.length or limit + 1)
        logger.error("result larger than the maximum; recorded without it", extra={"bytes": size, "max": limit})
        return {"result_bytes": size, "error": {"code": "result_too_large",
                                                "message": f"the result has {size} bytes or more (max {limit})"}}

    def _result_not_there(self, chain: PollMessage, hold: Hold, reply: Retryable | Refused, now: float) -> Outcome:
        """The result route says the result is not there. A job only a list or webhook said was
        completed goes back to a status read (once: that read is the job's own word). Otherwise the
        result is late - for Sume's status said it is ready, or said nothing of it: the wait reads
        the result route again with the result-phase backoff until it comes; only the job's
        deadline ends the wait."""
        facts = chain.outcome or {}
        log = {"http_status": reply.http_status, "request_id": reply.request_id, "waits": chain.result_waits}
        if facts.get("source") in ("list", "webhook"):
            logger.info("no result for a job reported finished; its status decides", extra=log)
            return self._requeue(chain, hold, due=now, name="unconfirmed", result_reads=1, phase=STATUS_PHASE,
                                 outcome=None)
        since = now - (chain.seen_terminal_at or now)
        (logger.info if since < self.s.jobs.not_found_grace else logger.warning)(
            "result not there yet; waiting for it", extra={**log, "seconds_since_terminal": round(since)})
        retry_after = reply.retry_after if isinstance(reply, Retryable) else None
        wait = retry_after if retry_after is not None else result_wait_delay(chain.result_waits, self.rng)
        return self._requeue(chain, hold, due=now + wait, name="result_not_ready", result_reads=1,
                             result_waits=chain.result_waits + 1, signals=("ResultNotReady",))

    def _transient(self, chain: PollMessage, hold: Hold, reply: Retryable, *, status_reads: int = 0,
                   result_reads: int = 0) -> Outcome:
        errors = chain.errors + 1
        delay = error_delay(errors, reply.retry_after, self.rng)
        logger.warning("transient Sume fault; re-queued", extra={
            "reason": reply.reason, "http_status": reply.http_status, "request_id": reply.request_id,
            "delay": round(delay, 1), "errors": errors})
        signals = ("SumeThrottled",) if reply.http_status == 429 else ()
        return self._requeue(chain, hold, due=self.clock.now() + delay, name="transient", errors=errors,
                             signals=signals, status_reads=status_reads, result_reads=result_reads)

    def _refused(self, chain: PollMessage, hold: Hold, reply: Refused, deadline: Deadline, *,
                 status_reads: int = 0, result_reads: int = 0) -> Outcome:
        now = self.clock.now()
        log = {"http_status": reply.http_status, "code": reply.code, "request_id": reply.request_id}
        reads = {"status_reads": status_reads, "result_reads": result_reads}
        if reply.why == "not_found" and chain.phase != RESULT_PHASE:
            submitted = chain.submitted_at or chain.deadline_at - self.s.jobs.max_age
            if now - submitted < self.s.jobs.not_found_grace:
                logger.info("404 soon after submission (read-after-create lag); retrying", extra=log)
                return _with_signals(self._transient(chain, hold, Retryable("not_found_yet", http_status=404),
                                                     **reads), ("NotFoundGrace",))
        key_refused = reply.why == "key" or (reply.why == "forbidden" and self._key_refused(deadline))
        if key_refused is None:  # no read slot free for the key check now: ask again later
            return self._transient(chain, hold, Retryable("key_check_waits", http_status=reply.http_status), **reads)
        if key_refused:
            logger.error("Sume refused the API key: every read paused", extra={**log, "pause_seconds": KEY_PAUSE})
            try:
                self.budget.pause_key(KEY_PAUSE)
            except RedisFailure as exc:
                self._redis_failed(exc, "the key pause was not set")
            return self._requeue(chain, hold, due=now + KEY_PAUSE + self.rng.uniform(0, 30), name="key_rejected",
                                 signals=("SumeAuthFailed",), **reads)
        if reply.why == "forbidden":
            logger.error("Sume forbids this job (another workspace); recording it as failed", extra=log)
        else:
            logger.error("Sume refused this job; recording it as failed", extra=log)
        error = {"code": reply.code or reply.why, "message": reply.message or f"Sume answered {reply.http_status}"}
        return self._finish(chain, hold, "failed", None, error, status_reads=status_reads, result_reads=result_reads)

    def _key_refused(self, deadline: Deadline) -> bool | None:
        """After a 403 on a job: is it the key (True) or only this job (False)? One read that
        names no job (``GET /jobs?limit=1``), held for a minute; if the list route itself is
        forbidden, a job this container read fine recently decides. No evidence: the key. Each
        read takes its slot from the budget like any other; None: no slot soon enough."""
        now = self.clock.now()
        if now < self._key_ok_until:
            return False
        if not self._slot_soon(deadline):
            return None
        listing = self.sume.list_jobs(limit=1, budget=deadline.call_budget())
        self._tell_budget(listing.rate)
        if isinstance(listing, Refused) and listing.why == "forbidden" and self._last_ok_job:
            if not self._slot_soon(deadline):
                return None
            probe = self.sume.get_status(self._last_ok_job, budget=deadline.call_budget())
            self._tell_budget(probe.rate)
            refused = isinstance(probe, Refused) and probe.why in ("key", "forbidden")
        else:
            refused = isinstance(listing, Refused) and listing.why in ("key", "forbidden")
        if not refused:
            self._key_ok_until = now + KEY_CHECK_TTL
        return refused

    # -- ending -----------------------------------------------------------------------------------
    def _timed_out(self, chain: PollMessage, hold: Hold) -> Outcome:
        facts = chain.outcome or {}
        code = "result_not_ready" if chain.phase == RESULT_PHASE else "deadline_exceeded"
        return self._finish(chain, hold, "timed_out", facts.get("sume_status"),
                            {"code": code, "message": "sume-poller stopped watching this job at its deadline"})

    def _finish(self, chain: PollMessage, hold: Hold, status: str, sume_status: str | None,
                error: dict[str, str] | None, *, result: dict[str, Any] | None = None,
                status_reads: int = 0, result_reads: int = 0) -> Outcome:
        now = self.clock.now()
        ending = Ending(status, sume_status, error, result or {}, chain.reads, chain.result_reads,
                        chain.seen_running_at, chain.seen_terminal_at, chain.found_by or "chain")
        write = self.store.record_terminal(chain.job_id, ending, now=now)
        self._step("written", chain.job_id)
        if not write.won:
            self._discard(ending)
            return _counted(self._not_pending(chain.job_id, write.record, hold), status_reads, result_reads)
        assert write.record is not None
        self._finish_outbox(chain.job_id, write.record)
        (logger.warning if status == "timed_out" else logger.info)(
            "job terminal", extra={"status": status, "sume_status": sume_status, "reads": chain.reads})
        hold.release()
        self._step("released", chain.job_id)
        return Outcome("terminal", status_reads, result_reads, status)

    def _discard(self, ending: Ending) -> None:
        """An attempt that lost the terminal write removes the result object it wrote (the bucket's
        lifecycle rule expires it should this fail)."""
        key = ending.result.get("result_s3_key")
        if key and self.store.results is not None:
            try:
                self.store.results.discard(key)
            except AwsError as exc:
                logger.warning("result object of a losing attempt left to expire", extra={"error": type(exc).__name__})

    def _finish_outbox(self, job_id: str, record: dict[str, Any]) -> None:
        """Everything a terminal transition owes, each step safe to repeat: the observation of
        its completion time, the claim of its result object, the event, then the record leaves
        the index."""
        observation = completion_interval(record)
        if observation is not None:
            kind = str(record.get("kind"))
            for profile in dict.fromkeys((str(record.get("profile") or kind), kind)):
                self.store.put_observation(profile, job_id, *observation,
                                           at=float(record.get("terminal_at") or self.clock.now()))
        if record.get("result_s3_key") and self.store.results is not None:
            self.store.results.claim(str(record["result_s3_key"]))
        self.bus.put_terminal(job_id, record)
        self._step("published", job_id)
        self.store.clear_outbox(job_id, now=self.clock.now())

    def _not_pending(self, job_id: str, record: dict[str, Any] | None, hold: Hold,
                     duplicate: bool = False) -> Outcome:
        """The job is not (or no longer) pending: finish an earlier attempt's outbox, or drop."""
        if record is None:
            logger.error("poll message for a job that is not recorded; dropped")
            hold.release()
            return Outcome("unknown_job")
        if record.get("event_pending"):
            logger.info("finishing the outbox of an earlier attempt")
            self._finish_outbox(job_id, record)
            hold.release()
            return Outcome("outbox", status=str(record.get("status")))
        if record.get("status") == PENDING:
            logger.info("a duplicate of this step already read Sume (Redis down); dropped" if duplicate else
                        "an outbox message for a pending job; dropped (fan-out starts its chain)")
        else:
            logger.info("job already terminal; message dropped", extra={"status": record.get("status")})
        hold.release()
        return Outcome("duplicate", status=str(record.get("status")))

    # -- helpers ----------------------------------------------------------------------------------
    def _requeue(self, chain: PollMessage, hold: Hold, *, due: float, name: str, status_reads: int = 0,
                 result_reads: int = 0, signals: tuple[str, ...] = (), **changes: Any) -> Outcome:
        """Rest the lease until the next step is due, and hand that step back for sending.
        The next step never waits past the job's deadline (it then records timed_out)."""
        now = self.clock.now()
        due = min(max(due, now), float(chain.deadline_at))
        nxt = chain.next(seq=chain.seq + 1, due_at=round(due, 3), **changes)
        delay = min(max(due, nxt.paced_at or 0.0) - now, self.queue.max_delay)
        if nxt.normal_due is not None:  # a stretched chain hops to check that sweeps still cover it
            delay = min(delay, self.s.discovery.check)
        if nxt.paced_at is not None:  # waiting for the outage pacer: back soon, in case Redis is
            delay = min(delay, PACED_HOP)
        if not hold.rest(nxt, due, self.clock.to_real(delay) + self.s.lease.margin):
            logger.warning("lease lost before re-queue; another chain owns the job")
            return Outcome("lease_lost", status_reads, result_reads, signals=signals)
        self._step("rested", chain.job_id)
        return Outcome(name, status_reads, result_reads, send=Outgoing(chain.job_id, nxt.to_json(), delay),
                       undo=hold.undo_rest, signals=signals)

    def _first_read_covered(self, msg: PollMessage, now: float) -> bool:
        """A chain's first status read (not a hand-over: those read now) of a covered kind."""
        return (msg.reads == 0 and msg.normal_due is None and msg.found_by is None and msg.phase != RESULT_PHASE
                and self._stretches(msg.kind, msg.job_id, now))

    def _stretches(self, kind: str, job_id: str, now: float) -> bool:
        if self.coverage is None or is_canary(job_id):
            return False
        found = self.coverage.get()
        d = self.s.discovery
        return (d.sweeps and found.stretches(kind, now)) or (
            kind in d.webhook_kinds and found.webhooks_arrive(now, within=2 * d.safety))

    def _position(self, chain: PollMessage, now: float) -> tuple[Any, float, float | None, float]:
        """(model or None, age, age at the last read that saw it running, seconds since that read)."""
        submitted = chain.submitted_at or chain.deadline_at - self.s.jobs.max_age
        model = self.models(chain.profile or chain.kind, chain.kind) if self.s.schedule.learned else None
        last = None if chain.seen_running_at is None else chain.seen_running_at - submitted
        gap = now - (chain.seen_running_at if chain.seen_running_at is not None else submitted)
        return model, max(0.0, now - submitted), last, gap

    def _next_delay(self, chain: PollMessage, now: float, hint: float | None) -> float:
        model, age, last, _ = self._position(chain, now)
        return next_delay(chain.kind, chain.reads - 1, age, last, model, self.bounds, hint=hint, rng=self.rng)

    def _patience(self, chain: PollMessage, now: float) -> float:
        """How far away a read slot this step accepts: any (FIFO) without a learned model, for a
        result fetch, or past the max-gap backstop; otherwise by its chance of finding the job done."""
        if chain.phase == RESULT_PHASE:
            return math.inf
        model, age, last, gap = self._position(chain, now)
        if model is None or (self._pending is not None and overdue(gap, self._pending, self.budget.rate)):
            return math.inf
        return max_wait(read_priority(model, last, age), DEFAULT_W0)

    def _take_slot(self, mode: str = "take", max_wait: float = math.inf, slot: float = 0.0) -> Grant | None:
        """A read slot outside the gate (a fresh chain's, a second read in the same step); the
        outage pacer's while Redis is unreachable. None: the budget is unlimited."""
        if self.budget.unlimited:
            return None
        try:
            grant = self.budget.take(mode, max_wait, slot)
        except RedisFailure as exc:
            self._redis_failed(exc, "pacing this read locally")
            return Grant(True, self.pacer.take())
        self._learn(grant)
        return grant

    def _slot_soon(self, deadline: Deadline) -> bool:
        """A read slot for a read outside the job's chain (the key check): taken ahead of the line
        and waited for here when it is at most ``KEY_CHECK_WAIT`` away and the invocation has the
        time; False (nothing reserved) otherwise."""
        grant = self._take_slot("ahead", max_wait=KEY_CHECK_WAIT)
        if grant is None or grant.now:
            return True
        wait = self.clock.to_real(grant.wait)
        if not grant.granted or deadline.left() - wait < MIN_READ_REAL + AFTER_READ_REAL:
            return False
        time.sleep(wait)  # a fraction of a second where a slot is this close: cheaper than a re-queue's read
        return True

    def _learn(self, grant: Grant | None) -> None:
        if grant is not None:
            if grant.pending is not None:
                self._pending = grant.pending
            self.pacer.learn(grant.day_left)

    def _tell_budget(self, rate: RateInfo) -> None:
        if rate.retry_after is not None:
            self.pacer.pause(self.clock.now() + rate.retry_after)
        if rate.retry_after is None and not rate.worth_telling(self.budget.per_minute or None):
            return
        try:
            self.budget.feedback(rate)
        except RedisFailure as exc:
            self._redis_failed(exc, "the budget was not told what Sume said")

    def _redis_failed(self, exc: BaseException, consequence: str) -> str:
        """Log a Redis failure once, by kind (see :mod:`sume_poller.redisconn`); the signal to count."""
        kind = failure(exc)
        if kind == UNAVAILABLE:
            self.breaker.trip()
            reconnect(self.lease.client, exc)
            logger.warning(f"Redis unavailable: {consequence}", extra=describe(exc))
        else:
            logger.error(f"Redis refused a command (misconfigured): {consequence}", extra=describe(exc))
        return kind


def _refresh(chain: PollMessage, record: dict[str, Any]) -> PollMessage:
    """A chain that (re)starts takes the job's facts from its record."""
    submitted = record.get("submitted_at")
    return chain.next(kind=str(record.get("kind") or chain.kind),
                      deadline_at=int(record.get("deadline_at") or chain.deadline_at),
                      submitted_at=int(submitted) if isinstance(submitted, int | float) else chain.submitted_at,
                      profile=record.get("profile") or chain.profile)


def _with_signals(outcome: Outcome, signals: tuple[str, ...]) -> Outcome:
    return replace(outcome, signals=outcome.signals + signals)


def _not_there(reply: Retryable | Refused) -> bool:
    """The result route's answers for a result that is not there (yet): 404, or 409/425, which
    Sume may use for "not ready" (its contract does not say)."""
    return reply.http_status in (404, 409, 425)


def _counted(outcome: Outcome, status_reads: int = 0, result_reads: int = 0) -> Outcome:
    return replace(outcome, status_reads=outcome.status_reads + status_reads,
                   result_reads=outcome.result_reads + result_reads)


def completion_interval(record: dict[str, Any]) -> tuple[float, float | None] | None:
    """(lower, upper) ages in seconds between which the job finished, from its record: after
    the last read that saw it running, at or before the first that saw it terminal (upper None:
    never seen terminal, e.g. timed out). None when the record says nothing useful."""
    submitted = record.get("submitted_at")
    if not isinstance(submitted, int | float):
        return None
    running, terminal = record.get("seen_running_at"), record.get("seen_terminal_at")
    lower = max(0.0, float(running) - submitted) if isinstance(running, int | float) else 0.0
    if isinstance(terminal, int | float):
        return lower, max(lower, float(terminal) - submitted)
    if record.get("status") == "timed_out" and isinstance(running, int | float):
        return lower, None
    return None

