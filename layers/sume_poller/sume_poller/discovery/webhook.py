"""Webhooks (opt-in): Sume's signed delivery that a job is ready or failed, as a hint to read now.

Sume documents webhooks for some endpoints only (``webhook_url`` on create): events
``*.ready``/``*.failed`` with ``X-Sume-Event-Id``, ``X-Sume-Timestamp`` (unix seconds) and
``X-Sume-Signature: v1=<hex>``, the hex being HMAC-SHA256 of ``"{timestamp}.{raw body}"`` with
the integration's signing secret. A delivery whose signature, timestamp and event id check out is
Sume's own statement, signed with the secret only Sume and this deployment hold, so it is trusted
like a per-job read: it hands the job's waiting chain over (:meth:`LeaseStore.hand_over`) to a step
due now that, for ``*.ready``, reads the result at once (one read - should the result route say it
has none, the job goes back to a status read, once), and for ``*.failed`` records the failure the
body carries without a read. Any other event type gets a status read. Deliveries can repeat and
can be lost: polling stays the safety net for the lost ones. Each verified ``*.ready``/``*.failed``
delivery for a job of ours also records the job's age for its kind (:mod:`sume_poller.discovery.deliveries`):
chains of a kind whose deliveries arrive read late, after the job is likely done and delivered.

With several Sume keys, each key's integration has its own signing secret: the delivery is
checked against each (in constant time) and the one that verifies names the key; a job of another
key is left alone (a workspace cannot hand over another's jobs), and event ids are remembered per
key (one workspace's deliveries cannot mark another's seen).

Answers: 202 accepted (a chain step was queued, or the job needs nothing), 200 a duplicate event
id, 400 malformed, 401 a bad signature or a timestamp outside the tolerance (a replay), 413 a body
larger than ``MAX_BODY``. Nothing here reads Sume. Event ids are remembered (in Redis) for twice
the tolerance, after the step is queued, so a failure before that lets Sume's retry through.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ..config.keys import record_key
from ..config.settings import Common, Env, FunctionSettings, setting
from ..core.clock import Clock
from ..core.jobs import InvalidJobId, canonical_terminal_status, validate_job_id
from ..core.messages import RESULT_PHASE, Finding, PollMessage, Source
from ..core.observability import logger
from ..core.values import value
from ..limits.lease import LeaseStore, new_token
from ..limits.redisconn import RedisFailure, describe
from ..store.queue import Outgoing, PollQueue
from ..store.records import JobStore
from .coverage import CoverageStore
from .deliveries import DeliveryStore


@value(kw_only=True)
class WebhookSettings(FunctionSettings):
    """The webhook function's settings, read and validated once per container
    (:mod:`sume_poller.config.settings`)."""

    what: ClassVar[str] = "webhook function"
    #: The default key's signing secret (other keys' are in the key configuration).
    secret_name: str = setting("WEBHOOK_SECRET_NAME", "")
    secret_source: str = "secretsmanager"  # noqa: S105 (where the secret lives: "ssm" or "secretsmanager")
    #: A delivery whose timestamp is further than this from now is refused (clock seconds).
    tolerance: float = setting("WEBHOOK_TOLERANCE_SECONDS", 300.0, 1.0, 86_400.0)

    @classmethod
    def read_own(cls, env: Env, common: Common) -> dict[str, Any]:
        return {"secret_source": env.choice("WEBHOOK_SECRET_SOURCE", ("ssm", "secretsmanager"), "secretsmanager")}

    def check(self, env: Env) -> None:
        env.check(bool(self.secret_name or self.keys.config_secret),
                  "WEBHOOK_SECRET_NAME (the default key's) or SUME_KEYS_SECRET_NAME (the key configuration) "
                  "is required")

MAX_BODY = 64_000


@value
class Answer:
    """The webhook function's reply: an HTTP status and its JSON body."""

    status: int
    body: dict[str, Any]


def signature(secret: str, timestamp: str, raw: bytes) -> str:
    """The ``X-Sume-Signature`` a delivery of ``raw`` at ``timestamp`` must carry."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + raw, hashlib.sha256).hexdigest()
    return f"v1={digest}"


def raw_body(event: Mapping[str, Any]) -> bytes:
    """The request body of a Lambda function URL (or HTTP API v2) event, as Sume sent it."""
    body = event.get("body") or ""
    if event.get("isBase64Encoded"):
        return base64.b64decode(body)
    return body.encode() if isinstance(body, str) else b""


class WebhookReceiver:
    """``secrets``: each Sume key's signing secret by key id (``secret``: the one key's, for a
    deployment of one key); ``coverage``: the coverage state of a key (or the one key's)."""

    def __init__(self, clock: Clock, *, tolerance: float, store: JobStore, lease: LeaseStore, queue: PollQueue,
                 handover_ttl_real: float, margin_real: float = 0.0, secret: Callable[[], str] | None = None,
                 secrets: Callable[[], dict[str, str]] | None = None, default_key: str = "default",
                 coverage: CoverageStore | Callable[[str], CoverageStore] | None = None) -> None:
        self.clock = clock
        self.secrets = secrets or (lambda: {default_key: secret()} if secret else {})
        self.default_key = default_key
        self.tolerance = tolerance
        self.store = store
        self.lease = lease
        self.queue = queue
        self.handover_ttl_ms = max(1, int(handover_ttl_real * 1000))
        self.margin_ms = int(margin_real * 1000)
        self.seen_prefix = f"{lease.prefix}!webhook:"
        self.coverage = coverage

    def handle(self, headers: Mapping[str, str], raw: bytes) -> Answer:
        if len(raw) > MAX_BODY:
            return Answer(413, {"error": f"body larger than {MAX_BODY} bytes"})
        h = {k.lower(): v for k, v in headers.items()}
        event_id, stamp, signed = h.get("x-sume-event-id"), h.get("x-sume-timestamp"), h.get("x-sume-signature")
        if not event_id or not stamp or not signed or len(event_id) > 200:
            return Answer(400, {"error": "X-Sume-Event-Id, X-Sume-Timestamp and X-Sume-Signature are required"})
        try:
            sent_at = int(stamp)
        except ValueError:
            return Answer(400, {"error": "X-Sume-Timestamp must be unix seconds"})
        if abs(self.clock.now() - sent_at) > self.tolerance:
            return Answer(401, {"error": "timestamp outside the tolerance"})
        key = self._signer(stamp, raw, signed.strip())
        if key is None:
            return Answer(401, {"error": "bad signature"})
        try:
            payload = json.loads(raw)
            job_id = validate_job_id((payload.get("data") or {}).get("job_id"))
        except (ValueError, AttributeError, InvalidJobId) as exc:
            return Answer(400, {"error": f"malformed event: {str(exc)[:100]}"})
        seen = self._seen_key(key, event_id)
        if self._seen(seen):
            self._arrived(key)
            return Answer(200, {"duplicate": True})
        queued = self._hand_over(job_id, str(payload.get("type") or ""), payload.get("data") or {}, key)
        self._arrived(key)  # once the job's age is kept (_hand_over): see _arrived
        self._remember(seen)
        logger.info("webhook accepted", extra={"job_id": job_id, "event_id": event_id, "queued": queued})
        return Answer(202, {"job_id": job_id, "queued": queued})

    def _arrived(self, key: str) -> None:
        """Deliveries arrive: chains of webhook kinds read late (a Redis failure: not said). Said after
        the delivery's age is kept, never before: a container that sees deliveries arrive but no age
        for the kind stretches the chains it starts to ``LOST_WITHIN`` from submission, not the kind's
        plan, and keeps that view of the plan for ``DELIVERY_VIEW_TTL`` (a chain's first read, once
        set, stays)."""
        if (coverage := self._coverage(key)) is not None:
            with contextlib.suppress(*RedisFailure):
                coverage.webhook_arrived(self.clock.now())

    def _coverage(self, key: str) -> CoverageStore | None:
        if self.coverage is None:
            return None
        return self.coverage if isinstance(self.coverage, CoverageStore) else self.coverage(key)

    def _delivered(self, record: dict[str, Any], key: str) -> None:
        """A verified delivery's job age, for its kind's late plan (a Redis failure: only logged)."""
        coverage, submitted = self._coverage(key), record.get("submitted_at")
        if coverage is None or getattr(coverage, "client", None) is None or not isinstance(submitted, int | float):
            return
        try:
            DeliveryStore(coverage.client, coverage.prefix).delivered(str(record["kind"]), self.clock.now() - submitted)
        except RedisFailure as exc:
            logger.warning("webhook delivery age not kept", extra=describe(exc))

    def _signer(self, stamp: str, raw: bytes, signed: str) -> str | None:
        """The key whose secret signed the delivery (every key is checked: no early exit)."""
        found = None
        for key, secret in self.secrets().items():
            if hmac.compare_digest(signature(secret, stamp, raw), signed) and found is None:
                found = key
        return found

    def _seen_key(self, key: str, event_id: str) -> str:
        """Where an event id of ``key`` is remembered: per key, so one workspace's deliveries (signed
        with a secret its tenant may hold) never mark another's event ids seen; the default key's
        as before keys."""
        return self.seen_prefix + (event_id if key == self.default_key else f"{key}:{event_id}")

    def _seen(self, seen_key: str) -> bool:
        return bool(self.lease.client.exists(seen_key))

    def _remember(self, seen_key: str) -> None:
        try:
            ttl = max(1, int(self.clock.to_real(2 * self.tolerance)))
            self.lease.client.set(seen_key, "1", ex=ttl)
        except RedisFailure as exc:
            logger.warning("webhook event id not remembered", extra=describe(exc))

    def _hand_over(self, job_id: str, event_type: str, data: dict[str, Any], key: str) -> bool:
        """Hand the job's waiting chain over to a step due now that acts on what Sume said."""
        record = self.store.get(job_id)
        if record is None:
            return False  # not ours
        if record_key(record, self.default_key) != key:
            logger.warning("a delivery signed by one key for a job of another; left alone",
                           extra={"job_id": job_id, "signed_by": key, "job_key": record_key(record, self.default_key)})
            return False
        if event_type.endswith((".ready", ".failed")):
            self._delivered(record, key)
        if record.get("status") != "pending":
            return False  # already finished: nothing to do (no read, no second event)
        now = self.clock.now()
        held = self.lease.hand_over(job_id, new_token(), self.handover_ttl_ms, now=now, scale=self.clock.scale,
                                    margin_ms=self.margin_ms)
        if held is None:
            return False  # a delivery of its chain is reading it right now
        submitted = record.get("submitted_at")
        # Under a binding budget the read takes the slot its fenced step had reserved (no later
        # than a new one at the end of the line); otherwise it reads now.
        due = max(now, held.slot) if held.slot is not None else now
        message = PollMessage(job_id=job_id, kind=str(record["kind"]), deadline_at=int(record["deadline_at"]),
                              due_at=round(due, 3), token=held.token, seq=held.seq, slot_at=held.slot,
                              submitted_at=int(submitted) if isinstance(submitted, int | float) else None,
                              profile=record.get("profile"), found_by="webhook",
                              key=None if key == self.default_key else key)
        outcome = said(event_type, data)
        if outcome is not None:
            message = message.next(phase=RESULT_PHASE, outcome=outcome, seen_terminal_at=now)
        if self.queue.send([Outgoing(job_id, message.to_json(), due - now)]):
            self.lease.release(job_id, f"{held.token}:{held.seq}*")  # the chain's waiting step takes over
            raise RuntimeError("the poll queue refused the message; Sume will deliver the webhook again")
        return True


def said(event_type: str, data: dict[str, Any]) -> Finding | None:
    """What a verified delivery states: ``*.ready`` a completed job whose result is ready,
    ``*.failed`` a failure (its status and the error the body carries); None for any other type."""
    status = data.get("status") if isinstance(data.get("status"), str) else None
    if event_type.endswith(".ready"):
        return Finding("completed", Source.WEBHOOK, (status or "completed").lower()[:64])
    if not event_type.endswith(".failed"):
        return None
    canonical = canonical_terminal_status(status or "failed")
    if canonical == "completed":  # a ".failed" event naming a success: not a statement to act on
        return None
    raw = data.get("error")
    error = {k: str(raw[k])[:300] for k in ("code", "message") if isinstance(raw, dict) and raw.get(k)} or {
        "code": canonical, "message": f"Sume's webhook: the job {status or canonical}"}
    return Finding(canonical, Source.WEBHOOK, (status or canonical).lower()[:64], error)
