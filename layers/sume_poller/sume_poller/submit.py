"""Submit: start a paid Sume job (or register one started elsewhere), record it, start its chain.

The money path never depends on the lease. Every create carries an ``Idempotency-Key`` stable
for the submission (the caller's, or derived from kind + params), so a retry of the same event
- by this function, or by Lambda's own async retry - replays the original job instead of
billing twice. A 402 is final. Creates take from the shared create budget; over it, the event
fails with :class:`CreateBudgetExhausted`, which says when to retry (nothing is queued that
could bill later without the caller knowing).

A recorded job gets its chain here: submit takes the lease (``token:0``) and sends the first
poll message, so a fan-out tick during the first delay does not start a second chain.

Event (direct invoke)::

    {"kind": "image", "params": {...}, "idempotency_key": "optional-8-255-chars", "key": "acme"}
    {"kind": "video", "job_id": "job_abc", "key": "acme"}   # register an already submitted job

``key`` names the Sume key (:mod:`sume_poller.keys`) to create with and watch under (its create
budget, its API key); absent: the deployment's default key. An unknown key is rejected.

Reply: ``{"status": "submitted" | "registered" | "rejected", "job_ids": [...], "new": [...],
"replayed": bool, ...}``. ``replayed`` is true when no new job was started: Sume answered with
the job of an earlier request with the same key (for a derived key: the same kind and params,
submitted before), or the job was already recorded. Invalid input and final refusals come back
as ``rejected``; only transient failures raise (:class:`SubmitRetryable`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .budget import Budget, Grant, LocalPacer
from .jobs import KINDS, InvalidJobId, valid_key_id, validate_job_id
from .keys import Limits, SumeKey, UnknownKey
from .lease import LeaseStore, new_token
from .messages import PollMessage
from .observability import logger
from .queue import Outgoing, PollQueue
from .redisconn import RedisFailure, describe
from .schedule import Bounds, next_delay, profile_key
from .settings import SubmitSettings
from .store import JobStore
from .sume import Created, Refused, Retryable, SumeClient

IDEMPOTENCY_KEY_RE = re.compile(r"^[A-Za-z0-9_\-:.]{8,255}$")
MAX_PARAMS_BYTES = 64_000
CREATE_ATTEMPTS = 3


class SubmitRetryable(RuntimeError):
    """Sume's answer is unknown or transient: retry the same event (same Idempotency-Key)."""


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


@dataclass(frozen=True, slots=True)
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
                 sleep: Callable[[float], None] = time.sleep) -> None:
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
        if kind in self.s.webhook_kinds and self.s.webhook_url:
            params = {**params, "webhook_url": self.s.webhook_url}
        outcome = self._create(k, kind, params, key, remaining_ms)
        if isinstance(outcome, Refused):
            return _rejected(outcome.code or outcome.why, http_status=outcome.http_status,
                             request_id=outcome.request_id, idempotency_key=key)
        return self._submitted(k, kind, params, key, outcome, derived="idempotency_key" not in event)

    def _create(self, k: SubmitKey, kind: str, params: dict[str, Any], key: str,
                remaining_ms: Callable[[], int]) -> Created | Refused:
        """Create with the key, retrying transient faults with the same key while the invocation
        allows (``Retry-After`` honoured); raise :class:`SubmitRetryable` when it does not."""
        last: Retryable | None = None
        for attempt in range(CREATE_ATTEMPTS):
            self._take_create_slot(k)
            budget = max(0.1, (remaining_ms() - self.s.safety_margin_ms) / 1000)
            outcome = k.sume.create(kind, params, key, budget=budget)
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

    def _submitted(self, k: SubmitKey, kind: str, params: dict[str, Any], key: str, created: Created,
                   derived: bool) -> dict[str, Any]:
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
