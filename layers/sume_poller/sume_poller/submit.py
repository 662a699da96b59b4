"""Submit: start a paid Sume job (or register one started elsewhere) and record it as pending.

The money path never touches the lease. Every create carries an ``Idempotency-Key`` that is
stable for the submission (the caller's, or derived from kind + params), so a retry of the
same event - by this function after a timeout, or by Lambda's own async retry - replays the
original job instead of billing twice. A 402 is final.

Event (direct invoke)::

    {"kind": "image", "params": {...}, "idempotency_key": "optional-8-255-chars"}
    {"kind": "video", "job_id": "job_abc"}        # register an already submitted job

Reply: ``{"status": "submitted" | "registered" | "rejected", "job_ids": [...], ...}``.
Invalid input and final Sume refusals are returned as ``rejected`` (retrying cannot help);
only transient failures raise :class:`SubmitRetryable`, so an async invoke retries them.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from typing import Any

from .aws import JobStore, PollQueue
from .config import Settings
from .jobs import KINDS, InvalidJobId, backoff_delay, validate_job_id
from .messages import PollMessage
from .observability import logger
from .sume import Created, Fatal, SumeClient

IDEMPOTENCY_KEY_RE = re.compile(r"^[A-Za-z0-9_\-:.]{8,255}$")
MAX_PARAMS_BYTES = 64_000
CREATE_ATTEMPTS = 3


class SubmitRetryable(RuntimeError):
    """Sume's answer is unknown or transient; retry the same event (same Idempotency-Key)."""


def derive_idempotency_key(kind: str, params: dict[str, Any]) -> str:
    canonical = json.dumps({"kind": kind, "params": params}, sort_keys=True, separators=(",", ":"))
    return "sp-" + hashlib.sha256(canonical.encode()).hexdigest()[:40]


def _rejected(reason: str, **extra: Any) -> dict[str, Any]:
    logger.warning("submission rejected", extra={"reason": reason})
    return {"status": "rejected", "error": reason, "job_ids": [], **extra}


def handle_submit(event: Any, settings: Settings, sume: SumeClient, store: JobStore, queue: PollQueue,
                  remaining_ms: Callable[[], int], sleep: Callable[[float], None] = time.sleep
                  ) -> dict[str, Any]:
    if not isinstance(event, dict):
        return _rejected("event must be a JSON object")
    kind = event.get("kind")
    if kind not in KINDS:
        return _rejected(f"kind must be one of {sorted(KINDS)}")
    deadline = int(time.time()) + settings.job_max_age_seconds

    if "job_id" in event:
        try:
            job_id = validate_job_id(event["job_id"])
        except InvalidJobId as exc:
            return _rejected(str(exc))
        created = _record(settings, store, queue, job_id, kind, deadline, {})
        return {"status": "registered", "job_ids": [job_id], "new": [job_id] if created else []}

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

    outcome = None
    for attempt in range(CREATE_ATTEMPTS):
        outcome = sume.create(kind, params, key)
        if isinstance(outcome, Created | Fatal):
            break
        wait = min(outcome.retry_after if outcome.retry_after is not None else 0.5 * 2**attempt, 5.0)
        logger.warning("create outcome unknown or transient; retrying with the same key",
                       extra={"reason": outcome.reason, "http_status": outcome.http_status,
                              "attempt": attempt + 1})
        if attempt + 1 == CREATE_ATTEMPTS or remaining_ms() < wait * 1000 + settings.safety_margin_ms:
            break
        sleep(wait)
    if isinstance(outcome, Fatal):
        return _rejected(outcome.code or outcome.reason, http_status=outcome.http_status,
                         request_id=outcome.request_id, idempotency_key=key)
    if not isinstance(outcome, Created):
        raise SubmitRetryable(f"Sume create did not complete ({getattr(outcome, 'reason', '?')}); "
                              f"retry the same event to replay Idempotency-Key {key}")

    new: list[str] = []
    job_ids: list[str] = []
    for raw_id in outcome.job_ids:
        try:
            job_id = validate_job_id(raw_id)
        except InvalidJobId as exc:
            logger.error("Sume returned a job id this project cannot store", extra={"reason": str(exc)})
            continue
        job_ids.append(job_id)
        extra = {"idempotency_key": key, "sume_request_id": outcome.request_id}
        if _record(settings, store, queue, job_id, kind, deadline, extra):
            new.append(job_id)
    if not job_ids:  # paid for, but nothing this project can watch: say so, loudly
        logger.error("Sume created a job this project cannot watch", extra={"request_id": outcome.request_id})
        return _rejected("sume returned no storable job id", request_id=outcome.request_id, idempotency_key=key)
    logger.info("submitted", extra={"job_ids": job_ids, "request_id": outcome.request_id})
    return {"status": "submitted", "job_ids": job_ids, "new": new, "idempotency_key": key,
            "request_id": outcome.request_id}


def _record(settings: Settings, store: JobStore, queue: PollQueue, job_id: str, kind: str,
            deadline: int, extra: dict[str, Any]) -> bool:
    """Record the job as pending and queue its first poll; False if it was already recorded."""
    if not store.put_pending(job_id, kind, deadline, settings.pending_shards, extra):
        logger.info("job already recorded; nothing changed", extra={"job_id": job_id})
        return False
    delay = backoff_delay(kind, 0)
    first = PollMessage(job_id=job_id, kind=kind, deadline_at=deadline, due_at=round(time.time() + delay, 3))
    try:
        queue.send(first.to_json(), delay)
    except Exception as exc:  # recorded as pending: fan-out sends it on its next run
        logger.warning("first poll not queued; fan-out will send it",
                       extra={"job_id": job_id, "error": type(exc).__name__})
    return True
