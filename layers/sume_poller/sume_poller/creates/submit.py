"""Submit: start a paid Sume job (or register one started elsewhere), record it, start its chain.

The money path never depends on the lease. Every create carries an ``Idempotency-Key`` stable
for the submission (the caller's, or derived from kind + params), so a retry of the same event
- by this function, or by Lambda's own async retry - replays the original job instead of
billing twice. A 402 is final (and recorded, see below). Creates take from the key's create
budget; a submission it cannot take now is *queued* (:mod:`sume_poller.creates.createqueue`): kept in the
job table and created later, in arrival order per key, by the key's drain - the reply says
``queued``, with its idempotency key and an estimate of when it will be created. A queued
submission past its deadline (``SUBMIT_QUEUE_DEADLINE_SECONDS``) is recorded rejected with
``create_budget_exhausted``, never created. While a key's queue is not empty (or its drain runs), a
new submission queues behind it even when the budget has a slot: arrival order. ``"queue": false``
asks for the behaviour without a queue: over the budget the event fails with
:class:`CreateBudgetExhausted`, which says when to retry.

Every submission created, queued or rejected for good (402) has a *submission record*
(``#sub:<key>:<idempotency key>``): a replay of it (same idempotency key, same Sume key) is
answered from the table and takes nothing from the create budget.

A recorded job gets its chain here: submit takes the lease (``token:0``) and sends the first
poll message, so a fan-out tick during the first delay does not start a second chain.

Event (direct invoke)::

    {"kind": "image", "params": {...}, "idempotency_key": "optional-8-255-chars", "key": "acme", "queue": true}
    {"kind": "video", "job_id": "job_abc", "key": "acme"}   # register an already submitted job

``key`` names the Sume key (:mod:`sume_poller.config.keys`) to create with and watch under (its create
budget, its API key); absent: the deployment's default key. An unknown key is rejected.

Reply: ``{"status": "submitted" | "queued" | "registered" | "rejected", "job_ids": [...],
"new": [...], "replayed": bool, ...}`` (``queued`` adds ``estimated_create_at`` and
``deadline_at``, epoch s). ``replayed`` is true when no new job was started: the submission was
recorded already (answered from its record), Sume answered with the job of an earlier request
with the same key (for a derived key: the same kind and params, submitted before), or the job
was already recorded. Invalid input and final refusals come back as ``rejected``; only transient
failures raise (:class:`SubmitRetryable`, :class:`CreateBudgetExhausted` with ``"queue": false``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import time
from collections.abc import Callable
from typing import Any, ClassVar

from ..config.keys import Limits, SumeKey, UnknownKey
from ..config.settings import Common, Env, ScheduleSettings, SumeReaderSettings, kinds_of, setting
from ..core.jobs import KINDS, InvalidJobId, valid_key_id, validate_job_id
from ..core.messages import PollMessage
from ..core.observability import logger
from ..core.values import value
from ..limits.budget import Budget, Grant, Mode
from ..limits.lease import LeaseStore, new_token
from ..limits.pacer import LocalPacer
from ..limits.redisconn import RedisFailure, describe
from ..schedule.planner import Bounds, next_delay, profile_key
from ..store.queue import Outgoing, PollQueue
from ..store.records import JobStore
from ..store.submissions import CREATED, QUEUED, REJECTED, UNKNOWN_CREATES, queue_item, queued_record, settled_record
from ..sume.client import Refused, Retryable, SumeClient
from ..sume.created import Created
from .createqueue import DrainMessage, drain_lease, estimate_create_at


@value(kw_only=True)
class SubmitSettings(SumeReaderSettings):
    """The submit function's settings, read and validated once per container
    (:mod:`sume_poller.config.settings`)."""

    what: ClassVar[str] = "submit function"
    schedule: ScheduleSettings
    #: Kinds whose create endpoint accepts ``webhook_url`` (empty: webhooks off).
    webhook_kinds: frozenset[str] = frozenset()
    webhook_url: str | None = None
    #: The create queue (the drains' messages); empty: submissions never queue.
    create_queue_url: str = setting("CREATE_QUEUE_URL", "")
    #: A queued submission not created this long after it arrived is rejected (clock seconds).
    queue_deadline: float = setting("SUBMIT_QUEUE_DEADLINE_SECONDS", 3_600.0, 60.0, 86_400.0)

    @classmethod
    def read_own(cls, env: Env, common: Common) -> dict[str, Any]:
        return {"webhook_kinds": kinds_of(env.text("WEBHOOK_KINDS", "")),
                "webhook_url": env.text("WEBHOOK_URL", "") or None}

    def check(self, env: Env) -> None:
        SumeReaderSettings.check(self, env)  # slots dataclasses: no zero-argument super()
        env.check(not self.webhook_kinds or self.webhook_url is not None, "WEBHOOK_KINDS needs WEBHOOK_URL")

#: Refusals that are the key's, not the submission's (a refused key, a forbidden workspace): not
#: recorded, and a queued head waits them out. Every other refusal (a 402, a 400) is final for the
#: submission and recorded on its submission record: a replay answers it from the table.
KEY_REFUSALS = ("key", "forbidden")

IDEMPOTENCY_KEY_RE = re.compile(r"^[A-Za-z0-9_\-:.]{8,255}$")
MAX_PARAMS_BYTES = 64_000
CREATE_ATTEMPTS = 3
#: Reads of a submission's record before queueing it while creates of it are noted concurrently.
ENQUEUE_TRIES = 3


class SubmitRetryable(RuntimeError):
    """Sume's answer is unknown or transient: retry the same event (same Idempotency-Key)."""


class SubmissionSettled(Exception):
    """The submission was settled (created or rejected by a duplicate of it) before this create was
    sent: nothing was sent; its record answers."""


def not_created(outcome: Created | Refused | Retryable) -> bool:
    """Sume answered a create without creating anything and without deciding the submission: a
    429, or a refusal of the key (not of the submission)."""
    if isinstance(outcome, Retryable):
        return outcome.http_status == 429
    return isinstance(outcome, Refused) and outcome.why in KEY_REFUSALS


class CreateBudgetExhausted(SubmitRetryable):
    """The create budget is spent for now; ``retry_after`` says when a create fits again."""

    def __init__(self, retry_after: float) -> None:
        self.retry_after = retry_after
        super().__init__(f"the Sume create budget is exhausted: retry the same event in {math.ceil(retry_after)} s")


def derive_idempotency_key(kind: str, params: dict[str, Any]) -> str:
    canonical = json.dumps({"kind": kind, "params": params}, sort_keys=True, separators=(",", ":"))
    return "sp-" + hashlib.sha256(canonical.encode()).hexdigest()[:40]


def _rejected(reason: str, **extra: Any) -> dict[str, Any]:
    logger.warning("submission rejected", extra={"reason": reason})
    return {"status": "rejected", "error": reason, "job_ids": [], **extra}


@value
class SubmitKey:
    """What a submission uses of its Sume key: the key, its client and its create budget (with the
    outage pacer that stands in for it while Redis is down)."""

    key: SumeKey
    sume: SumeClient
    creates: Budget
    pacer: LocalPacer

    @property
    def message_key(self) -> str | None:
        """What poll messages carry: None for the default key (as before keys)."""
        return None if self.key.default else self.key.id


def one_key(sume: SumeClient, creates: Budget, pacer: LocalPacer, key_id: str = "default") -> Callable[
        [str | None], SubmitKey]:
    """A deployment of one key (the default): every submission uses these parts."""
    only = SubmitKey(SumeKey(key_id, Limits(), lambda: "", default=True), sume, creates, pacer)

    def keys(wanted: str | None) -> SubmitKey:
        if wanted not in (None, key_id):
            raise UnknownKey(str(wanted))
        return only

    return keys


class Submitter:
    def __init__(self, settings: SubmitSettings, *, keys: Callable[[str | None], SubmitKey], store: JobStore,
                 queue: PollQueue, lease: LeaseStore, models: Callable[[str, str], Any] | None = None,
                 sleep: Callable[[float], None] = time.sleep, create_queue: PollQueue | None = None) -> None:
        self.s = settings
        self.clock = settings.common.clock
        self.keys = keys
        self._noted: set[str] = set()  # keys this container told the table about
        self.store = store
        self.queue = queue
        self.lease = lease
        self.models = models or (lambda profile, kind: None)
        self.bounds = Bounds(settings.schedule.min_interval, settings.schedule.max_interval,
                             settings.schedule.age_fraction)
        self.sleep = sleep
        #: The drains' queue (None: no queue here; every submission behaves as ``"queue": false``).
        self.create_queue = create_queue

    def handle(self, event: Any, remaining_ms: Callable[[], int]) -> dict[str, Any]:
        if not isinstance(event, dict):
            return _rejected("event must be a JSON object")
        kind = event.get("kind")
        if kind not in KINDS:
            return _rejected(f"kind must be one of {sorted(KINDS)}")
        key_id = event.get("key")
        if key_id is not None and not valid_key_id(key_id):
            return _rejected("key must be 1-32 letters, digits, '_' or '-' (the id of a configured Sume key)")
        try:
            k = self.keys(key_id)
        except UnknownKey as exc:
            return _rejected(str(exc))
        logger.append_keys(key=k.key.id)
        if "job_id" in event:
            try:
                job_id = validate_job_id(event["job_id"])
            except InvalidJobId as exc:
                return _rejected(str(exc))
            new = self._record(k, job_id, kind, None, {})
            return {"status": "registered", "job_ids": [job_id], "new": [job_id] if new else [], "replayed": not new,
                    "key": k.key.id}
        params = event.get("params", {})
        if not isinstance(params, dict):
            return _rejected("params must be a JSON object")
        try:
            size = len(json.dumps(params))
        except (TypeError, ValueError):
            return _rejected("params must be JSON-serialisable")
        if size > MAX_PARAMS_BYTES:
            return _rejected(f"params larger than {MAX_PARAMS_BYTES} bytes")
        key = event.get("idempotency_key") or derive_idempotency_key(kind, params)
        if not isinstance(key, str) or not IDEMPOTENCY_KEY_RE.fullmatch(key):
            return _rejected("idempotency_key must be 8-255 characters of A-Z a-z 0-9 _ - : .")
        logger.append_keys(idempotency_key=key)
        queue = event.get("queue", True)
        if not isinstance(queue, bool):
            return _rejected("queue must be true or false")
        replay = self.replay(k, key)
        if replay is not None:
            return replay
        if kind in self.s.webhook_kinds and self.s.webhook_url:
            params = {**params, "webhook_url": self.s.webhook_url}
        derived = "idempotency_key" not in event
        queue = queue and self.create_queue is not None
        if queue and self._queue_busy(k):  # arrival order: behind those already waiting
            return self._enqueue(k, kind, params, key, derived)
        try:
            outcome = self._create(k, kind, params, key, remaining_ms)
        except CreateBudgetExhausted:
            if not queue:
                raise
            return self._enqueue(k, kind, params, key, derived)
        except SubmissionSettled:  # a duplicate of it settled it while this one was about to create
            replay = self.replay(k, key)
            if replay is None:
                raise SubmitRetryable("a duplicate of this submission was recorded concurrently; retry the same "
                                      "event") from None
            return replay
        if isinstance(outcome, Refused):
            return self._refused(k, kind, key, outcome, derived)
        reply = self.record_created(k, kind, params, key, outcome, derived)
        if reply["status"] == "submitted":
            self.store.put_submission(settled_record(k.key.id, kind, key, CREATED, now=self.clock.now(),
                                                     derived=derived, job_ids=reply["job_ids"],
                                                     request_id=outcome.request_id))
        return reply

    # -- the create queue ---------------------------------------------------------------------------
    def replay(self, k: SubmitKey, key: str) -> dict[str, Any] | None:
        """The answer to a submission recorded already (created, queued or rejected), from its
        submission record; None when there is none."""
        record = self.store.submission(k.key.id, key)
        status = None if record is None else record.get("status")
        if record is None or status is None:  # none, or only its attempt record: not recorded yet
            return None
        base = {"job_ids": list(record.get("job_ids") or []), "new": [], "replayed": True, "key": k.key.id,
                "idempotency_key": key, "derived_key": bool(record.get("derived_key"))}
        logger.info("submission replayed from its record", extra={"submission_status": status})
        if status == CREATED:
            return {"status": "submitted", **base, "request_id": record.get("request_id")}
        if status == QUEUED:
            return {"status": "queued", **base, "deadline_at": record.get("deadline_at"),
                    "estimated_create_at": self._estimate(k, str(record.get("queue_item", "")))}
        error = record.get("error") or {}
        return {"status": REJECTED, **base, "error": error.get("code") if isinstance(error, dict) else error,
                **{f: record[f] for f in ("http_status", "request_id", "message") if record.get(f) is not None}}

    def _queue_busy(self, k: SubmitKey) -> bool:
        """The key's queue holds submissions, or its drain runs: a new one queues behind them. (A
        key whose creates are not limited here queues nothing: nothing to ask.)"""
        if k.creates.unlimited:
            return False
        try:
            if self.lease.held([drain_lease(k.key.id)])[0]:
                return True
        except RedisFailure as exc:
            logger.warning("drain lease not read (Redis); the queue's index decides", extra=describe(exc))
        return bool(self.store.queue_head(k.key.id))

    def _enqueue(self, k: SubmitKey, kind: str, params: dict[str, Any], key: str, derived: bool) -> dict[str, Any]:
        """Queue the submission (its item and record in one transaction), start the key's drain."""
        now = self.clock.now()
        item = queue_item(k.key.id, kind=kind, params=params, idempotency_key=key, derived=derived, arrived=now,
                          deadline_at=now + self.s.queue_deadline)
        for _ in range(ENQUEUE_TRIES):
            record = self.store.submission(k.key.id, key)
            if record is not None and record.get("status") is not None:  # a duplicate of it came first
                replay = self.replay(k, key)
                assert replay is not None
                return replay
            # creates of it were sent already (an attempt record): the queued record keeps their count
            unknown = None if record is None else int(record.get(UNKNOWN_CREATES) or 0)
            if self.store.enqueue(item, queued_record(item), unknown_creates=unknown):
                break
        else:
            raise SubmitRetryable("a duplicate of this submission was recorded concurrently; retry the same event")
        self.start_drain(k.key.id, k.message_key)
        estimate = self._estimate(k, item["job_id"])
        logger.info("submission queued", extra={"queue_item": item["job_id"], "estimated_create_at": estimate})
        return {"status": QUEUED, "job_ids": [], "new": [], "replayed": False, "key": k.key.id,
                "idempotency_key": key, "derived_key": derived, "estimated_create_at": estimate,
                "deadline_at": item["deadline_at"]}

    def start_drain(self, key_id: str, message_key: str | None) -> bool:
        """Start the key's drain if none runs (its lease is free): its first message, due now."""
        token = new_token()
        try:
            if not self.lease.start(drain_lease(key_id), token, self.s.lease.start_ttl * 1000):
                return False
        except RedisFailure as exc:
            logger.warning("drain not started (Redis); fan-out starts it", extra=describe(exc))
            return False
        assert self.create_queue is not None
        if self.create_queue.send([Outgoing(key_id, DrainMessage(token, 0, message_key).to_json(), 0.0)]):
            logger.warning("drain message not sent; fan-out starts the drain", extra={"key": key_id})
            with contextlib.suppress(*RedisFailure):
                self.lease.release(drain_lease(key_id), f"{token}:0")
            return False
        return True

    def _estimate(self, k: SubmitKey, item_id: str) -> int:
        """When the queued submission ``item_id`` should be created (epoch s, see
        :func:`~sume_poller.creates.createqueue.estimate_create_at`)."""
        ahead = self.store.queue_ahead(k.key.id, item_id) if item_id else 0
        now = self.clock.now()  # after the query: the budget's wait is from (nearly) this moment
        try:
            first, state = k.creates.take(mode=Mode.PEEK).wait, k.creates.state()
        except RedisFailure:
            first, state = 0.0, {}
        return math.ceil(estimate_create_at(now, ahead, first, k.creates.per_minute, k.creates.per_day, state))

    def _refused(self, k: SubmitKey, kind: str, key: str, refused: Refused, derived: bool) -> dict[str, Any]:
        """A create Sume refused: a 402 (any refusal but the key's) is recorded for the caller."""
        if refused.why not in KEY_REFUSALS:
            self.store.put_submission(settled_record(
                k.key.id, kind, key, REJECTED, now=self.clock.now(), derived=derived,
                error={"code": refused.code or refused.why, "message": refused.message or ""},
                http_status=refused.http_status, request_id=refused.request_id))
        return _rejected(refused.code or refused.why, http_status=refused.http_status,
                         request_id=refused.request_id, idempotency_key=key)

    def _create(self, k: SubmitKey, kind: str, params: dict[str, Any], key: str,
                remaining_ms: Callable[[], int]) -> Created | Refused:
        """Create with the key, retrying transient faults with the same key while the invocation
        allows (``Retry-After`` honoured); raise :class:`SubmitRetryable` when it does not."""
        last: Retryable | None = None
        for attempt in range(CREATE_ATTEMPTS):
            self._take_create_slot(k)
            # noted before it is sent: a crash or a timeout after it leaves the evidence (the drain
            # replays such a submission's create before rejecting it)
            if not self.store.note_create(k.key.id, key, None, now=self.clock.now()):
                raise SubmissionSettled(key)
            timeout = max(0.1, (remaining_ms() - self.s.safety_margin_ms) / 1000)
            outcome = k.sume.create(kind, params, key, timeout=timeout)
            if not_created(outcome):
                self.store.create_answered(k.key.id, key)
            if not isinstance(outcome, Retryable):
                return outcome
            last = outcome
            wait = outcome.retry_after if outcome.retry_after is not None else 0.5 * 2**attempt
            logger.warning("create outcome unknown or transient; retrying with the same key",
                           extra={"reason": outcome.reason, "http_status": outcome.http_status,
                                  "attempt": attempt + 1, "wait": wait})
            if attempt + 1 == CREATE_ATTEMPTS or remaining_ms() < self.clock.to_real(wait) * 1000 + \
                    self.s.safety_margin_ms + 1000:
                break
            self.sleep(self.clock.to_real(wait))
        assert last is not None
        when = f" after {math.ceil(last.retry_after)} s" if last.retry_after is not None else ""
        raise SubmitRetryable(f"Sume create did not complete ({last.reason}); retry the same event{when} "
                              f"to replay its Idempotency-Key")

    def _take_create_slot(self, k: SubmitKey) -> None:
        try:
            grant = k.creates.take(max_wait=0.0)
        except RedisFailure:
            wait = k.pacer.take()
            grant = Grant(wait <= 0, wait)
        if not grant.now:
            raise CreateBudgetExhausted(max(grant.wait, 1.0))

    def record_created(self, k: SubmitKey, kind: str, params: dict[str, Any], key: str, created: Created,
                       derived: bool) -> dict[str, Any]:
        """Record what a create started (each job pending, its chain started); the reply."""
        new: list[str] = []
        job_ids: list[str] = []
        for raw_id in created.job_ids:
            try:
                job_id = validate_job_id(raw_id)
            except InvalidJobId as exc:
                logger.error("Sume returned a job id this project cannot store", extra={"reason": str(exc)})
                continue
            job_ids.append(job_id)
            if self._record(k, job_id, kind, profile_key(kind, params),
                            {"idempotency_key": key, "sume_request_id": created.request_id}):
                new.append(job_id)
        if not job_ids:  # paid for, but nothing this project can watch: say so, loudly
            logger.error("Sume created a job this project cannot watch", extra={"request_id": created.request_id})
            return _rejected("sume returned no storable job id", request_id=created.request_id, idempotency_key=key)
        replayed = created.replayed or not new
        logger.info("submitted", extra={"job_ids": job_ids, "request_id": created.request_id, "replayed": replayed})
        return {"status": "submitted", "job_ids": job_ids, "new": new, "replayed": replayed, "key": k.key.id,
                "idempotency_key": key, "derived_key": derived, "request_id": created.request_id}

    def _record(self, k: SubmitKey, job_id: str, kind: str, profile: str | None, extra: dict[str, Any]) -> bool:
        """Record the job as pending and start its chain; False if it was already recorded."""
        now = self.clock.now()
        model = self.models(profile or kind, kind) if self.s.schedule.learned else None
        delay = next_delay(kind, 0, 0.0, None, model, self.bounds)
        if not self.store.put_pending(job_id, kind, now=now, deadline_at=int(now) + self.s.jobs.max_age,
                                      profile=profile, chain_due_at=now + delay, extra=extra, key=k.key.id,
                                      own_partition=not k.key.default):
            logger.info("job already recorded; nothing changed", extra={"job_id": job_id})
            return False
        if not k.key.default and k.key.id not in self._noted:  # fan-out reads the key's partitions
            self.store.note_key(k.key.id)
            self._noted.add(k.key.id)
        token = new_token()
        try:
            ttl = self.clock.to_real(delay) + self.s.lease.start_ttl
            self.lease.start(job_id, token, max(1, int(ttl * 1000)))
        except RedisFailure as exc:  # the chain runs without the lease until Redis is back
            logger.warning("lease not taken (Redis); the first poll runs unleased", extra=describe(exc))
        first = PollMessage(job_id=job_id, kind=kind, deadline_at=int(now) + self.s.jobs.max_age,
                            due_at=round(now + delay, 3), token=token, seq=0, submitted_at=int(now), profile=profile,
                            key=k.message_key)
        if self.queue.send([Outgoing(job_id, first.to_json(), delay)]):
            logger.warning("first poll not queued; fan-out starts the chain", extra={"job_id": job_id})
            with contextlib.suppress(*RedisFailure):
                self.lease.release(job_id, f"{token}:0")
        return True
