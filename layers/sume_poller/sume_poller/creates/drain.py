"""The drain: a key's queued submissions created head by head, in arrival order, as its create budget allows.

One drain per key is a chain of messages on the create queue (:class:`~sume_poller.creates.createqueue.DrainMessage`)
under the key's drain lease (``!drain:<key>``, the chain protocol of :mod:`sume_poller.limits.lease`:
claim, rest, release), consumed by the submit function. One step:

1. claim the lease (held by another delivery or drain: the message is dropped; free: this message
   runs a fresh chain);
2. read the queue's head (none: the lease is released and the drain ends; the queue is read once
   more after that, so a submission queued meanwhile starts a drain again);
3. a head whose submission is settled already (a step that crashed after settling it, or a duplicate
   created without waiting) leaves the queue; a head past its deadline is recorded ``rejected``
   with ``create_budget_exhausted`` (counted ``SubmissionsExpired``) and leaves it - unless its
   record counts creates of unknown outcome (``unknown_creates``: every create, submit's and the
   drain's, is noted on the record before it is sent and taken back when Sume answers it without
   creating anything - a 429, the key's refusal - so a timeout, a 5xx or a crash after sending
   leaves the count): Sume may have created and billed it. Then its create is replayed with its
   Idempotency-Key on a create slot taken ahead of the queue (the documented replay returns the
   job if an attempt landed, and creates it otherwise: what the caller asked for), as soon as one
   is free and again after Sume's ``Retry-After`` or a 5xx, for up to :data:`REPLAY_WINDOW` after
   the deadline, so it ends known - watched, or refused with Sume's answer; only a replay window
   without any answer rejects it so (``unknown_attempts`` in its record, counted
   ``SubmissionsExpiredUnknown``); a head of a key the configuration no longer holds is recorded
   ``rejected`` with ``key_removed``;
4. one create slot of the key's budget: a slot further away is reserved and the step re-queues
   itself for it (the message carries the slot; a Lambda never waits);
5. the create, with the submission's own Idempotency-Key, noted on the record first (a record no
   longer queued by this head: nothing is sent, the head leaves the queue): created -> the jobs are recorded and their
   chains started (:meth:`~sume_poller.creates.submit.Submitter.record_created`, as submit does), the record
   settled ``created`` with the job ids, the head leaves the queue; a 402 (or another refusal final
   for the submission) -> recorded ``rejected``; a 429, a 5xx, an unknown outcome or a refused key
   -> the same head again after ``Retry-After`` or a doubling backoff (the next create of it
   replays the same Idempotency-Key: never billed twice);
6. rest the lease on the next step and send it.

Each step is safe to repeat: settling is conditional on the record still being queued by that
head, leaving the queue is a delete, and a create repeated after a crash replays its
Idempotency-Key. Fan-out restarts a drain that died (a non-empty queue, a free lease). A settled
head is counted (``SubmissionsCreatedFromQueue``, ``SubmissionsExpired``, ...) by the one step
whose delete removed its queue item, from what its record says: a step that settled it and lost
the write's reply, or died before the delete, leaves the count to the next step.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import field, replace
from typing import Any

from ..config.keys import UnknownKey
from ..core.observability import logger
from ..core.values import value
from ..limits.budget import Mode, RateInfo
from ..limits.lease import BUSY_RETRY, ChainStep, Claim, LeaseStore, new_nonce, new_token
from ..limits.redisconn import RedisFailure
from ..store.queue import Outgoing, PollQueue
from ..store.records import JobStore
from ..store.submissions import CREATED, QUEUED, REJECTED, UNKNOWN_CREATES
from ..sume.client import Refused
from ..sume.created import Created
from .createqueue import EXPIRED, KEY_REMOVED, DrainMessage, DrainMessageError, drain_lease
from .submit import KEY_REFUSALS, SubmitKey, SubmitSettings, Submitter, not_created

#: The longest backoff (clock seconds) between create attempts of one head after transient faults.
BACKOFF_MAX = 300.0
#: How long after its deadline a head whose creates had an unknown outcome is replayed (clock
#: seconds) until Sume answers: a create slot ahead of the queue, Sume's 429s and 5xx waited out.
REPLAY_WINDOW = 900.0


@value(frozen=False, slots=False)
class DrainReport:
    """What one invocation's drain steps did (its metrics)."""

    failures: list[str] = field(default_factory=list)
    created: int = 0
    rejected: int = 0
    expired: int = 0
    waited: int = 0
    retried: int = 0
    dropped: int = 0
    #: Creates replayed at a head's deadline (creates of it had an unknown outcome).
    replayed: int = 0
    #: Heads rejected at their deadline though creates of them had an unknown outcome (no replay answered).
    expired_unknown: int = 0

    def response(self) -> dict[str, Any]:
        return {"batchItemFailures": [{"itemIdentifier": mid} for mid in self.failures]}

    def count(self, settled: dict[str, Any]) -> None:
        """A settled submission's outcome (its record's values), counted by the step whose dequeue
        removed its queue item: once, also where the step that settled it lost the write's reply or
        died before its dequeue (the next step finds it settled, removes the item and counts it)."""
        if settled.get("status") == CREATED:
            self.created += 1
        elif (settled.get("error") or {}).get("code") == EXPIRED:
            self.expired += 1
            self.expired_unknown += 1 if settled.get("unknown_attempts") else 0
        else:
            self.rejected += 1


class Drainer:
    def __init__(self, settings: SubmitSettings, submitter: Submitter, keys: Callable[[str | None], SubmitKey],
                 store: JobStore, queue: PollQueue, lease: LeaseStore, default_key: str) -> None:
        self.s = settings
        self.clock = settings.common.clock
        self.submitter = submitter
        self.keys = keys
        self.store = store
        self.queue = queue
        self.lease = lease
        self.default_key = default_key

    def run(self, event: dict[str, Any], remaining_ms: Callable[[], int]) -> DrainReport:
        """An SQS batch of drain messages, one after the other; a message that fails (poison, an
        AWS or Redis fault) is left for SQS to deliver again (and, repeated, to its dead-letter queue)."""
        report = DrainReport()
        for record in event.get("Records", []):
            mid = str(record.get("messageId"))
            if remaining_ms() < self.s.safety_margin_ms:
                report.failures.append(mid)
                continue
            try:
                self.step(DrainMessage.parse(record.get("body")), report, remaining_ms)
            except DrainMessageError as exc:
                logger.error("poison drain message", extra={"reason": str(exc)})
                report.failures.append(mid)
            except Exception as exc:
                logger.exception("drain step failed; SQS delivers it again", extra={"error": type(exc).__name__})
                report.failures.append(mid)
        return report

    def step(self, msg: DrainMessage, report: DrainReport, remaining_ms: Callable[[], int]) -> None:
        key_id = msg.key or self.default_key
        name = drain_lease(key_id)
        nonce = new_nonce()
        step, fresh = ChainStep(msg.token, msg.seq, nonce), ChainStep(new_token(), 0, nonce)
        claim = self.lease.claim(name, step, fresh, self.s.lease.claim_ttl * 1000)
        if claim is Claim.HELD:
            logger.info("drain held by another step; message dropped", extra={"key": key_id})
            report.dropped += 1
            return
        if claim is Claim.BUSY:  # an older step of this drain may be mid-create: this one comes back
            logger.info("an older drain step is mid-step; message comes back", extra={"key": key_id})
            if self.queue.send([Outgoing("again", msg.to_json(), self.clock.from_real(BUSY_RETRY))]):
                raise RuntimeError("the drain message was not sent again")  # SQS delivers this one again
            return
        if claim is Claim.FRESH:
            step, msg = fresh, replace(msg, token=fresh.token, seq=0)
        logger.append_keys(key=key_id)
        head = self._head(key_id)
        if head is None:
            self.lease.release(name, step.claimed)
            if self.store.queue_head(key_id):  # queued while this step looked: drain again
                self.submitter.start_drain(key_id, msg.key)
            return
        item, record = head
        logger.append_keys(idempotency_key=item.get("idempotency_key"), queue_item=item["job_id"])
        now = self.clock.now()
        if record is None or record.get("status") != QUEUED or record.get("queue_item") != item["job_id"]:
            self._leave(str(item["job_id"]), record, report)  # settled already: only its queue item was left
            self._next(msg, step, 0.0, slot=msg.slot)  # a slot reserved and not spent serves the next head
            return
        deadline = float(item["deadline_at"])
        if now >= deadline:
            unknown = int(record.get(UNKNOWN_CREATES) or 0)
            if unknown and now < deadline + REPLAY_WINDOW and self._replay(msg, step, item, report, remaining_ms):
                return
            if unknown:  # no answer within the replay window (or its key is gone): Sume may have billed it
                logger.error("a queued submission expired with creates of unknown outcome; no replay got an answer",
                             extra={"unknown_creates": unknown})
            self._settle(item, report, REJECTED, error={"code": EXPIRED, "message": "the create budget did not take it "
                                                        "before its deadline (SubmitQueueDeadlineSeconds)"},
                         **({"unknown_attempts": unknown} if unknown else {}))
            self._next(msg, step, 0.0, slot=msg.slot)
            return
        try:
            k = self.keys(msg.key)
        except UnknownKey as exc:
            self._settle(item, report, REJECTED, error={"code": KEY_REMOVED, "message": str(exc)})
            self._next(msg, step, 0.0, slot=msg.slot)
            return
        deadline_in = float(item["deadline_at"]) - now
        if msg.slot is not None and msg.slot - now > k.creates.early:  # its reserved slot is still ahead
            self._next(msg, step, min(msg.slot - now, deadline_in), slot=msg.slot, errors=msg.errors)
            report.waited += 1
            return
        grant = k.creates.take(mode=Mode.CONFIRM, slot=msg.slot) if msg.slot is not None else k.creates.take()
        if not grant.now:
            slot = now + grant.wait if grant.granted else None
            self._next(msg, step, min(grant.wait, deadline_in), slot=slot, errors=msg.errors)
            report.waited += 1
            return
        self._create(k, msg, step, item, report, remaining_ms)

    def _head(self, key_id: str) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
        """The queue's first item that still exists (the index may still list one just deleted),
        and its submission record."""
        for item_id in self.store.queue_head(key_id, limit=3):
            item = self.store.get(item_id)
            if item is not None:
                return item, self.store.submission(key_id, str(item["idempotency_key"]))
        return None

    def _replay(self, msg: DrainMessage, step: ChainStep, item: dict[str, Any], report: DrainReport,
                remaining_ms: Callable[[], int]) -> bool:
        """A head at its deadline whose record counts creates of unknown outcome: its create is
        replayed with its Idempotency-Key on a create slot ahead of the queue (the documented replay
        returns the job if an attempt landed, and creates it otherwise); no slot now - the step
        comes back when one is free (within the replay window). False: its key is gone."""
        try:
            k = self.keys(msg.key)
        except UnknownKey:
            return False
        grant = k.creates.take(mode=Mode.AHEAD, max_wait=0.0)
        if not grant.now:
            left = float(item["deadline_at"]) + REPLAY_WINDOW - self.clock.now()
            self._next(msg, step, max(0.0, min(max(grant.wait, 1.0), left)), errors=msg.errors)
            report.waited += 1
            return True
        logger.warning("a queued submission at its deadline has creates of unknown outcome: "
                       "replaying its create with the same Idempotency-Key", extra={"attempts": msg.errors})
        report.replayed += 1
        self._create(k, msg, step, item, report, remaining_ms)
        return True

    def _create(self, k: SubmitKey, msg: DrainMessage, step: ChainStep, item: dict[str, Any], report: DrainReport,
                remaining_ms: Callable[[], int]) -> None:
        """The head's create (before its deadline, or its replay after it)."""
        kind, key = str(item["kind"]), str(item["idempotency_key"])
        params = json.loads(item["params"])
        # noted before it is sent: a crash or a timeout after it leaves the evidence a replay acts on
        if not self.store.note_create(k.key.id, key, str(item["job_id"]), now=self.clock.now()):
            # settled meanwhile (a duplicate created it at once, or another step of this head settled it)
            self._leave(str(item["job_id"]), self.store.submission(k.key.id, key), report)
            self._next(msg, step, 0.0)
            return
        timeout = max(0.1, (remaining_ms() - self.s.safety_margin_ms) / 1000)
        outcome = k.sume.create(kind, params, key, timeout=timeout)
        if not_created(outcome):  # a 429, the key's refusal: nothing created, this attempt is known
            self.store.create_answered(k.key.id, key)
        if isinstance(outcome, Created):
            reply = self.submitter.record_created(k, kind, params, key, outcome, bool(item.get("derived_key")))
            if reply["status"] == "submitted":
                self._settle(item, report, CREATED, job_ids=reply["job_ids"], request_id=outcome.request_id,
                             replayed=reply["replayed"])
            else:
                self._settle(item, report, REJECTED, error={"code": reply["error"], "message": reply["error"]},
                             request_id=outcome.request_id)
            self._next(msg, step, 0.0)
            return
        if isinstance(outcome, Refused) and outcome.why not in KEY_REFUSALS:  # a 402, a 400: final
            self._settle(item, report, REJECTED, error={"code": outcome.code or outcome.why,
                                                        "message": outcome.message or ""},
                         http_status=outcome.http_status, request_id=outcome.request_id)
            self._next(msg, step, 0.0)
            return
        retry_after = outcome.retry_after if not isinstance(outcome, Refused) else None
        if retry_after is not None:  # Sume's 429: every create of the key waits
            with contextlib.suppress(*RedisFailure):
                k.creates.feedback(RateInfo(retry_after=retry_after))
        wait = retry_after if retry_after is not None else min(BACKOFF_MAX, 2.0 ** min(msg.errors, 16))
        logger.warning("create of the queue's head failed; retried with the same Idempotency-Key",
                       extra={"reason": getattr(outcome, "reason", None) or getattr(outcome, "why", None),
                              "http_status": outcome.http_status, "wait": wait})
        report.retried += 1
        # before its deadline: back at the latest at it; after it (a replay): within the replay window
        deadline = float(item["deadline_at"])
        end = deadline if self.clock.now() < deadline else deadline + REPLAY_WINDOW
        self._next(msg, step, min(wait, max(0.0, end - self.clock.now())), errors=msg.errors + 1)

    def _settle(self, item: dict[str, Any], report: DrainReport, status: str, **values: Any) -> None:
        """Record the head's outcome (while it is still queued by this head), then it leaves the queue;
        counted (:meth:`DrainReport.count`) if this step's dequeue removed it."""
        key_id, idempotency_key, item_id = str(item["key"]), str(item["idempotency_key"]), str(item["job_id"])
        written = {"status": status, "settled_at": round(self.clock.now(), 3), **values}
        settled: dict[str, Any] | None = {**written, "queue_item": item_id}
        if not self.store.settle_submission(key_id, idempotency_key, item_id, written):
            # settled before: by this write (its retry after a lost reply met it), by another step of
            # this head, or by a duplicate submit
            settled = self.store.submission(key_id, idempotency_key)
        self._leave(item_id, settled, report)
        logger.info("queued submission settled", extra={"submission_status": status, "queue_item": item["job_id"]})

    def _leave(self, item_id: str, record: dict[str, Any] | None, report: DrainReport) -> None:
        """The head leaves the queue. Counted (:meth:`DrainReport.count`) when this call's delete removed
        its item and its record is settled naming it - by the drain; a duplicate submit's record names
        no queue item, and one queued again names the new item."""
        if (self.store.dequeue(item_id) and record is not None and record.get("queue_item") == item_id
                and record.get("status") != QUEUED):
            report.count(record)

    def _next(self, msg: DrainMessage, step: ChainStep, delay: float, *, slot: float | None = None,
              errors: int = 0) -> None:
        """Rest the lease on the next step and send it, due in ``delay`` (at most one SQS delay:
        a longer wait takes several hops, the slot carried along)."""
        delay = max(0.0, min(delay, self.queue.max_delay))
        nxt = DrainMessage(step.token, step.seq + 1, msg.key, errors, None if slot is None else round(slot, 3))
        name = drain_lease(msg.key or self.default_key)
        ttl = self.clock.to_real(delay) + self.s.lease.margin
        if not self.lease.rest(name, step, max(1, int(ttl * 1000))):
            logger.warning("drain lease lost; another drain goes on", extra={"key": msg.key or self.default_key})
            return
        if self.queue.send([Outgoing("next", nxt.to_json(), delay)]):
            with contextlib.suppress(*RedisFailure):
                self.lease.release(name, f"{step.token}:{step.seq + 1}")
            raise RuntimeError("the drain's next message was not sent")  # this message comes again
