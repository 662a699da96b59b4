"""Sume HTTP client on urllib3: one pooled manager per container, typed outcomes.

Every call returns an outcome instead of raising, so the poll path can decide per job:

* :class:`Pending`   - not terminal yet (maybe with Sume's ``next_poll_after_seconds``);
* :class:`Terminal`  - terminal (by ``terminal: true`` or a terminal status);
* :class:`Retryable` - a transient fault (timeout, 429, 5xx, garbage body), with the delay
  Sume asked for via ``Retry-After`` when it sent one;
* :class:`Fatal`     - retrying cannot help: ``scope="key"`` (401/403: the API key is bad),
  ``scope="job"`` (404/400: this job id), ``scope="submission"`` (402: no credits).

At most one in-process retry, and only for connect errors (urllib3 ``Retry``), where no request
reached Sume; read timeouts and statuses are never retried in-process: a 429/503 becomes the
re-queue delay instead.
The API key is never logged; neither are result URLs or payloads.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import urllib3
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.util import Retry, Timeout

from .jobs import CREATE_PATHS, State, canonical_terminal_status, classify_status

MAX_RETRY_AFTER = 3600.0
_MAX_BODY = 1_000_000


@dataclass(frozen=True, slots=True)
class Pending:
    status: str
    next_poll_after: float | None = None
    unknown_status: bool = False
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Terminal:
    status: str  # canonical: completed | failed | canceled | expired
    sume_status: str
    result_ready: bool
    error: dict[str, str] | None = None
    request_id: str | None = None
    next_poll_after: float | None = None


@dataclass(frozen=True, slots=True)
class Retryable:
    reason: str
    retry_after: float | None = None
    http_status: int | None = None
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Fatal:
    reason: str
    scope: str  # "key" | "job" | "submission"
    http_status: int | None = None
    code: str | None = None
    message: str | None = None
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Result:
    payload: dict[str, Any]
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Created:
    job_ids: tuple[str, ...]
    request_id: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


StatusOutcome = Pending | Terminal | Retryable | Fatal
ResultOutcome = Result | Retryable | Fatal
CreateOutcome = Created | Retryable | Fatal


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date), capped at an hour."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def _error_fields(body: Any) -> tuple[str | None, str | None, str | None]:
    """(code, message, request_id) from Sume's error envelope, tolerating any shape."""
    if not isinstance(body, dict):
        return None, None, None
    request_id = body.get("request_id") if isinstance(body.get("request_id"), str) else None
    err = body.get("error")
    if isinstance(err, dict):
        code = err.get("code") if isinstance(err.get("code"), str) else None
        message = err.get("message") if isinstance(err.get("message"), str) else None
        return code, (message or "")[:300] or None, request_id
    return None, None, request_id


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        f = float(value)
    except OverflowError:  # a JSON integer beyond any float (json.loads takes 4300 digits)
        return None
    return f if math.isfinite(f) and f >= 0 else None


def interpret_status(body: Any, request_id: str | None = None) -> StatusOutcome:
    """Turn a 200 reply of ``GET /jobs/{id}`` into an outcome (pure; unit-tested)."""
    if not isinstance(body, dict):
        return Retryable("malformed_body", request_id=request_id)
    inner = body.get("job")
    job: dict[str, Any] = inner if isinstance(inner, dict) else body
    status = job.get("status")
    if not isinstance(status, str) or not status.strip():
        return Retryable("missing_status", request_id=request_id)
    status = status.strip().lower()[:64]

    def hint(name: str) -> Any:
        return job[name] if name in job else body.get(name)

    terminal_flag = hint("terminal")
    result_ready = hint("result_ready")
    next_poll = _number(hint("next_poll_after_seconds"))
    state = classify_status(status)
    # An explicit ``terminal`` flag wins; without it the status decides.
    terminal = terminal_flag if isinstance(terminal_flag, bool) else state in (State.SUCCEEDED, State.FAILED)
    if not terminal:
        return Pending(status, next_poll, unknown_status=state is State.UNKNOWN, request_id=request_id)
    succeeded = state is State.SUCCEEDED or (state is State.UNKNOWN and result_ready is True)
    canonical = canonical_terminal_status(status, succeeded)
    error = None
    raw_error = job.get("error")
    if canonical != "completed" and isinstance(raw_error, dict):
        error = {
            k: str(raw_error[k])[:300]
            for k in ("code", "message")
            if isinstance(raw_error.get(k), str | int)
        }
    ready = canonical == "completed" and (result_ready if isinstance(result_ready, bool) else True)
    return Terminal(canonical, status, ready, error or None, request_id, next_poll)


def extract_job_ids(body: Any) -> tuple[str, ...]:
    """Job ids from a create reply: ``job.id``, ``job_id``, ``job_ids`` or ``jobs[].id``."""
    if not isinstance(body, dict):
        return ()
    ids: list[Any] = []
    job = body.get("job")
    if isinstance(job, dict):
        ids.append(job.get("id") or job.get("job_id"))
    ids.append(body.get("job_id"))
    ids.append(body.get("id"))
    for name in ("job_ids", "jobs"):
        many = body.get(name)
        if isinstance(many, list):
            for item in many:
                ids.append(item.get("id") or item.get("job_id") if isinstance(item, dict) else item)
    seen: dict[str, None] = {}
    for i in ids:
        if isinstance(i, str) and i:
            seen.setdefault(i)
    return tuple(seen)


class SumeClient:
    """A thread-safe Sume client; build one per container and reuse it."""

    def __init__(
        self,
        base_url: str,
        api_key: Callable[[], str],
        *,
        connect_timeout: float = 3.0,
        read_timeout: float = 10.0,
        pool_size: int = 16,
        on_auth_failure: Callable[[], None] | None = None,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._api_key = api_key
        self._on_auth_failure = on_auth_failure
        self._http = urllib3.PoolManager(
            num_pools=4,
            maxsize=pool_size,
            block=False,
            timeout=Timeout(connect=connect_timeout, read=read_timeout),
            # One in-process retry, and only where no request reached Sume (connect errors):
            # a read timeout or a status is never retried here, so one message = one Sume read.
            retries=Retry(total=1, connect=1, read=0, status=0, other=0, redirect=0,
                          backoff_factor=0.1, raise_on_status=False),
            headers={"Accept": "application/json", "User-Agent": "sume-poller/0.1"},
        )

    # -- transport -----------------------------------------------------------------------
    def _request(
        self, method: str, path: str, body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int | None, Any, Mapping[str, str], str | None]:
        """(http status or None on transport failure, parsed JSON or a sentinel, headers, error)."""
        hdrs = {"Authorization": f"Bearer {self._api_key()}"}
        if headers:
            hdrs.update(headers)
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        try:
            resp = self._http.request(method, self._base + path, body=payload, headers=hdrs,
                                      preload_content=False)
        except Urllib3Error as exc:
            reason = type(getattr(exc, "reason", None) or exc).__name__
            return None, None, {}, reason
        try:
            raw = resp.read(_MAX_BODY + 1)
        except Urllib3Error as exc:
            return None, None, {}, type(exc).__name__
        finally:
            resp.release_conn()
        if len(raw) > _MAX_BODY:
            return resp.status, _MALFORMED, resp.headers, None
        try:
            parsed = json.loads(raw) if raw else _MALFORMED
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            parsed = _MALFORMED
        return resp.status, parsed, resp.headers, None

    def _failure(self, status: int, body: Any, headers: Mapping[str, str]) -> Retryable | Fatal:
        code, message, request_id = _error_fields(body)
        request_id = request_id or headers.get("X-Request-Id")
        if status in (401, 403):
            if self._on_auth_failure:
                self._on_auth_failure()
            return Fatal(code or "unauthorized", "key", status, code, message, request_id)
        if status == 402:
            return Fatal(code or "insufficient_credits", "submission", status, code, message, request_id)
        if status in (408, 409, 425, 429) or status >= 500:
            return Retryable(code or f"http_{status}", parse_retry_after(headers.get("Retry-After")),
                             status, request_id)
        return Fatal(code or f"http_{status}", "job", status, code, message, request_id)

    # -- API -----------------------------------------------------------------------------
    def get_status(self, job_id: str) -> StatusOutcome:
        status, body, headers, err = self._request("GET", f"/jobs/{quote(job_id, safe='')}")
        if status is None:
            return Retryable(f"transport:{err}")
        if status != 200:
            return self._failure(status, body, headers)
        if body is _MALFORMED:
            return Retryable("malformed_body", http_status=200, request_id=headers.get("X-Request-Id"))
        rid = body.get("request_id") if isinstance(body, dict) else None
        return interpret_status(body, rid if isinstance(rid, str) else headers.get("X-Request-Id"))

    def get_result(self, job_id: str) -> ResultOutcome:
        status, body, headers, err = self._request("GET", f"/jobs/{quote(job_id, safe='')}/result")
        if status is None:
            return Retryable(f"transport:{err}")
        if status != 200:
            return self._failure(status, body, headers)
        if not isinstance(body, dict):
            return Retryable("malformed_body", http_status=200)
        rid = body.get("request_id")
        return Result(body, rid if isinstance(rid, str) else headers.get("X-Request-Id"))

    def create(self, kind: str, params: Mapping[str, Any], idempotency_key: str) -> CreateOutcome:
        """Start a paid job. Always sends ``Idempotency-Key``; retry only with the same key."""
        path = CREATE_PATHS[kind]
        status, body, headers, err = self._request(
            "POST", path, body=params, headers={"Idempotency-Key": idempotency_key})
        if status is None:
            return Retryable(f"transport:{err}")  # outcome unknown: the caller retries with the key
        if status not in (200, 201, 202):
            return self._failure(status, body, headers)
        ids = extract_job_ids(body)
        if not ids:
            return Retryable("create_reply_without_job_id", http_status=status)
        rid = body.get("request_id") if isinstance(body, dict) else None
        return Created(ids, rid if isinstance(rid, str) else headers.get("X-Request-Id"), body)


class _Malformed:
    def __repr__(self) -> str:
        return "<malformed body>"


_MALFORMED: Any = _Malformed()
