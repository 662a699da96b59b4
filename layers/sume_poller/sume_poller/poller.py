"""The poll step: one SQS message, at most one Sume status read.

For each message::

    claim lease  -> (lost: drop quietly)
    [lease was free] consistent read of the record: finished? finish its outbox or drop
    due later    -> hop: re-queue toward due_at (<= 900 s per hop), no Sume read
    past deadline / attempt cap -> record timed_out
    read Sume    -> pending / transient fault: renew lease to delay + margin, re-queue
                 -> terminal: fetch result when ready, conditional write, event, release
                 -> key rejected (401/403): pause fan-out, stop this chain loudly

The lease holds ``"<token>:<seq>"``. A message owns the chain only if the lease holds exactly
its own ``token:seq``; claiming moves the lease to ``token:seq+1`` so a duplicate of the same
message finds it taken. A message that does not own the chain may only take a free lease.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from .aws import EventBus, JobStore, PollQueue, terminal_event
from .config import Settings
from .jobs import PENDING, backoff_delay, error_delay, hint_delay, hop_delay
from .lease import LeaseStore, new_token
from .messages import MessageError, PollMessage, parse_message
from .observability import MetricUnit, logger, metrics
from .sume import Fatal, Pending, Result, Retryable, SumeClient, Terminal

#: A message this close to its due time is read now rather than hopped again (seconds).
HOP_TOLERANCE = 0.1
#: How long a message waits before retrying when Redis cannot be reached.
REDIS_RETRY_DELAY = 30

Checkpoint = Callable[[str, str], None]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one message (the batch handler turns these into metrics)."""

    name: str
    delay: int | None = None
    status: str | None = None
    reads: int = 0
    failed: bool = False


class Poller:
    def __init__(self, settings: Settings, lease: LeaseStore, sume: SumeClient, store: JobStore,
                 queue: PollQueue, bus: EventBus, *, clock: Callable[[], float] = time.time,
                 checkpoint: Checkpoint | None = None) -> None:
        self.s = settings
        self.lease = lease
        self.sume = sume
        self.store = store
        self.queue = queue
        self.bus = bus
        self.clock = clock
        self.claim_ttl_ms = settings.claim_ttl_seconds * 1000
        # Fault-injection hook for tests: called after each step with (step, job_id).
        self._checkpoint = checkpoint

    def _step(self, name: str, job_id: str) -> None:
        if self._checkpoint is not None:
            self._checkpoint(name, job_id)

    # -- the lease ----------------------------------------------------------------------
    def _claim(self, msg: PollMessage, ttl_ms: int) -> tuple[str, int, bool] | str:
        """(token, seq now held, lease was free), or why not: "contention" (another chain holds
        the job) or "auth_paused" (Sume rejected the key recently: no chain starts)."""
        if msg.token is not None:
            held = f"{msg.token}:{msg.seq + 1}"
            if self.lease.renew(msg.job_id, msg.lease_value or "", held, ttl_ms):
                return msg.token, msg.seq + 1, False
        else:
            held = f"{new_token()}:1"
        # Not this chain's turn: only a free lease may be taken. This is also where every chain
        # starts (submit, fan-out, recovery), so it is where the auth pause is honoured.
        taken = self.lease.acquire_unless_paused(msg.job_id, held, ttl_ms)
        if taken is None:
            return "auth_paused"
        if not taken:
            return "contention"
        token, seq = held.rsplit(":", 1)
        return token, int(seq), True

    def _release(self, job_id: str, held: str) -> None:
        try:
            self.lease.release(job_id, held)
        except RedisError as exc:  # it expires on its own
            logger.warning("lease release failed; it will expire", extra={"error": type(exc).__name__})
        self._step("released", job_id)

    # -- the message ----------------------------------------------------------------------
    def process(self, msg: PollMessage) -> Outcome:
        now = self.clock()
        # Not due yet (SQS caps one delay at 900 s): hop on without reading Sume, but never past
        # the job's deadline. A message a hair early (clock skew) is treated as due.
        remaining = min(msg.due_at, msg.deadline_at) - now
        hop = hop_delay(remaining, self.s.max_delay_seconds) if remaining > HOP_TOLERANCE else None
        ttl_ms = (hop + self.s.lease_margin_seconds) * 1000 if hop is not None else self.claim_ttl_ms
        try:
            claimed = self._claim(msg, ttl_ms)
        except RedisError as exc:
            return self._redis_unavailable(msg, exc)
        if isinstance(claimed, str):
            if claimed == "auth_paused":
                logger.warning("Sume auth is paused after a rejected key; message dropped, "
                               "fan-out resumes the job after the pause")
            else:
                logger.info("lease held by another chain; dropping message", extra={"seq": msg.seq})
            return Outcome(claimed)
        token, seq, was_free = claimed
        held = f"{token}:{seq}"
        self._step("claimed", msg.job_id)
        kind, deadline = msg.kind, msg.deadline_at

        if was_free:
            record = self.store.get(msg.job_id)
            if record is None:
                logger.error("poll message for a job that is not recorded; dropping it")
                self._release(msg.job_id, held)
                return Outcome("unknown_job")
            if record.get("status") != PENDING:
                return self._already_terminal(msg.job_id, record, held)
            kind = str(record.get("kind") or kind)
            deadline = int(record.get("deadline_at") or deadline)

        chain = msg.next(token=token, seq=seq, kind=kind, deadline_at=deadline)
        if now >= deadline or msg.attempt >= self.s.max_poll_attempts:
            why = "deadline_exceeded" if now >= deadline else "attempts_exceeded"
            return self._finish(chain, held, "timed_out", None,
                                {"code": why, "message": "sume-poller stopped watching this job"}, None)
        if hop is not None:
            self._send(chain, hop, held)
            logger.debug("hop toward due time", extra={"delay": hop, "remaining": round(remaining)})
            return Outcome("hopped", delay=hop)

        reply = self.sume.get_status(msg.job_id)
        self._step("read", msg.job_id)
        if isinstance(reply, Pending):
            if reply.unknown_status:
                logger.warning("unknown Sume status; treating as not terminal",
                               extra={"sume_status": reply.status, "request_id": reply.request_id})
                metrics.add_metric(name="UnknownStatus", unit=MetricUnit.Count, value=1)
            delay = (hint_delay(reply.next_poll_after) if reply.next_poll_after is not None
                     else backoff_delay(kind, msg.attempt))
            return self._requeue(chain, held, delay, errors=0, name="requeued")
        if isinstance(reply, Retryable):
            return self._transient(chain, held, reply)
        if isinstance(reply, Fatal):
            return self._fatal(chain, held, reply)
        return self._terminal(chain, held, reply)

    def _terminal(self, chain: PollMessage, held: str, reply: Terminal) -> Outcome:
        result: dict[str, Any] | None = None
        error = reply.error
        if reply.status == "completed":
            if not reply.result_ready:
                delay = (hint_delay(reply.next_poll_after) if reply.next_poll_after is not None
                         else backoff_delay("image", 0))
                return self._requeue(chain, held, delay, errors=0, name="result_not_ready")
            fetched = self.sume.get_result(chain.job_id)
            self._step("result", chain.job_id)
            if isinstance(fetched, Retryable):
                return self._transient(chain, held, fetched, reads=1)
            if isinstance(fetched, Fatal):
                if fetched.scope == "key":
                    return self._fatal(chain, held, fetched)
                logger.error("Sume has no result for a completed job",
                             extra={"code": fetched.reason, "request_id": fetched.request_id})
                error = {"code": "result_unavailable", "message": fetched.reason}
            elif isinstance(fetched, Result):
                result = fetched.payload
        return self._finish(chain, held, reply.status, reply.sume_status, error, result)

    def _finish(self, chain: PollMessage, held: str, status: str, sume_status: str | None,
                error: dict[str, str] | None, result: dict[str, Any] | None) -> Outcome:
        reads = 0 if status == "timed_out" else 1
        write = self.store.record_terminal(chain.job_id, status, sume_status=sume_status, error=error,
                                           result=result, attempts=chain.attempt + reads,
                                           shards=self.s.pending_shards)
        self._step("written", chain.job_id)
        if write.won:
            assert write.record is not None
            self._publish(chain.job_id, write.record)
            log = logger.warning if status == "timed_out" else logger.info
            log("job terminal", extra={"status": status, "sume_status": sume_status,
                                       "attempts": chain.attempt + reads})
            self._release(chain.job_id, held)
            return Outcome("terminal", status=status, reads=reads)
        if write.record is None:
            logger.error("terminal job is not recorded; nothing written")
            self._release(chain.job_id, held)
            return Outcome("unknown_job", reads=reads)
        outcome = self._already_terminal(chain.job_id, write.record, held)
        return Outcome(outcome.name, status=outcome.status, reads=reads)

    def _already_terminal(self, job_id: str, record: dict[str, Any], held: str) -> Outcome:
        """A message for a job that is already recorded terminal: finish its outbox or drop."""
        if record.get("event_pending"):
            logger.info("finishing the terminal event of an earlier attempt")
            self._publish(job_id, record)
            self._release(job_id, held)
            return Outcome("outbox", status=str(record.get("status")))
        logger.info("job already terminal; duplicate message dropped",
                    extra={"status": record.get("status")})
        self._release(job_id, held)
        return Outcome("duplicate", status=str(record.get("status")))

    def _publish(self, job_id: str, record: dict[str, Any]) -> None:
        self.bus.put_terminal(terminal_event(job_id, record))
        self._step("published", job_id)
        self.store.clear_outbox(job_id)

    def _transient(self, chain: PollMessage, held: str, reply: Retryable, reads: int = 0) -> Outcome:
        errors = chain.errors + 1
        delay = error_delay(errors, reply.retry_after)
        logger.warning("transient Sume fault; re-queued", extra={
            "reason": reply.reason, "http_status": reply.http_status,
            "request_id": reply.request_id, "delay": delay, "errors": errors})
        return self._requeue(chain, held, delay, errors=errors, name="transient", extra_reads=reads)

    def _fatal(self, chain: PollMessage, held: str, reply: Fatal) -> Outcome:
        if reply.scope == "key":
            logger.error("Sume rejected the API key: polling stopped and fan-out paused", extra={
                "http_status": reply.http_status, "code": reply.code, "request_id": reply.request_id,
                "pause_seconds": self.s.auth_pause_seconds})
            try:
                self.lease.pause_auth(self.s.auth_pause_seconds)
            except RedisError:
                logger.warning("could not set the auth pause in Redis")
            self._release(chain.job_id, held)
            return Outcome("auth_failed", reads=1)
        logger.error("Sume refused this job; recording it as failed", extra={
            "http_status": reply.http_status, "code": reply.code, "request_id": reply.request_id})
        return self._finish(chain, held, "failed", None,
                            {"code": reply.code or reply.reason, "message": reply.message or ""}, None)

    def _requeue(self, chain: PollMessage, held: str, delay: int, *, errors: int, name: str,
                 extra_reads: int = 0) -> Outcome:
        now = self.clock()
        # Never wait past the deadline: the message then comes back and records timed_out.
        delay = max(1, min(delay, math.ceil(chain.deadline_at - now)))
        nxt = chain.next(attempt=chain.attempt + 1, errors=errors, due_at=round(now + delay, 3))
        send_delay = min(delay, self.s.max_delay_seconds)
        try:
            still_ours = self.lease.renew(chain.job_id, held, held,
                                          (send_delay + self.s.lease_margin_seconds) * 1000)
        except RedisError as exc:
            # Keep the chain going: the next message re-takes a free lease or finds a newer chain.
            logger.warning("lease renew failed (Redis); re-queueing anyway",
                           extra={"error": type(exc).__name__})
            still_ours = True
        if not still_ours:
            logger.warning("lease lost before re-queue; another chain owns the job")
            return Outcome("lease_lost", reads=1 + extra_reads)
        self._step("renewed", chain.job_id)
        self._send(nxt, send_delay, held)
        return Outcome(name, delay=delay, reads=1 + extra_reads)

    def _send(self, msg: PollMessage, delay: int, held: str) -> None:
        try:
            self.queue.send(msg.to_json(), delay)
        except Exception:
            # Free the lease so SQS's redelivery of this message can take it straight away.
            self._release(msg.job_id, held)
            raise
        self._step("requeued", msg.job_id)

    def _redis_unavailable(self, msg: PollMessage, exc: Exception) -> Outcome:
        """No lease, no Sume read: send the same message again later (it keeps its place)."""
        logger.warning("Redis unavailable; message re-sent unchanged",
                       extra={"error": type(exc).__name__, "delay": REDIS_RETRY_DELAY})
        self.queue.send(msg.to_json(), REDIS_RETRY_DELAY)
        return Outcome("redis_unavailable", delay=REDIS_RETRY_DELAY)


# -- the batch ---------------------------------------------------------------------------------
_POOL = ThreadPoolExecutor(max_workers=10, thread_name_prefix="poll")
#: Outcomes this container has seen (also emitted as metrics); local runs and the demo read it.
OUTCOME_TOTALS: Counter[str] = Counter()


def _process_record(poller: Poller, record: Any) -> Outcome:
    message_id = record.get("messageId") if isinstance(record, dict) else None
    try:
        msg = parse_message(record.get("body") if isinstance(record, dict) else None)
    except MessageError as exc:
        logger.error("malformed poll message", extra={"message_id": message_id, "reason": str(exc)})
        return Outcome("malformed", failed=True)
    logger.thread_safe_append_keys(correlation_id=msg.job_id)
    try:
        return poller.process(msg)
    except Exception as exc:
        logger.exception("poll failed; SQS will retry the message",
                         extra={"message_id": message_id, "error": type(exc).__name__})
        return Outcome("error", failed=True)
    finally:
        logger.thread_safe_clear_keys()


def handle_batch(event: Any, remaining_ms: Callable[[], int], poller: Poller) -> dict[str, Any]:
    """Poll every record of an SQS batch concurrently; partial batch response.

    Records not finished before the invocation's safety margin are reported as failures, so
    SQS delivers them again instead of the whole batch failing on a timeout.
    """
    records = event.get("Records") if isinstance(event, dict) else None
    if not isinstance(records, list):
        raise ValueError("not an SQS event: no Records list")
    futures = {}
    failures: list[str] = []
    for record in records:
        message_id = record.get("messageId") if isinstance(record, dict) else None
        if not isinstance(message_id, str) or not message_id:
            logger.error("SQS record without messageId ignored")
            continue
        futures[_POOL.submit(_process_record, poller, record)] = message_id
    budget = max(0.0, (remaining_ms() - poller.s.safety_margin_ms) / 1000)
    done, not_done = wait(futures, timeout=budget)
    for future in not_done:
        logger.warning("record not finished before the timeout margin; SQS will retry it",
                       extra={"message_id": futures[future]})
        failures.append(futures[future])
    reads = 0
    for future in done:
        outcome: Outcome = future.result()
        OUTCOME_TOTALS[outcome.name] += 1
        reads += outcome.reads
        metrics.add_metric(name=f"Outcome_{outcome.name}", unit=MetricUnit.Count, value=1)
        if outcome.status and outcome.name == "terminal":
            metrics.add_metric(name=f"Terminal_{outcome.status}", unit=MetricUnit.Count, value=1)
        if outcome.name == "contention":
            metrics.add_metric(name="LeaseContention", unit=MetricUnit.Count, value=1)
        if outcome.delay is not None:
            metrics.add_metric(name="RequeueDelay", unit=MetricUnit.Seconds, value=outcome.delay)
        if outcome.failed:
            failures.append(futures[future])
    metrics.add_metric(name="SumeReads", unit=MetricUnit.Count, value=reads)
    metrics.add_metric(name="Polls", unit=MetricUnit.Count, value=len(done))
    if failures:
        metrics.add_metric(name="BatchItemFailures", unit=MetricUnit.Count, value=len(failures))
    return {"batchItemFailures": [{"itemIdentifier": mid} for mid in failures]}
