"""Sume HTTP client on urllib3: one pooled manager per container, typed outcomes.

Every call returns an outcome instead of raising, so the caller decides per job:

* :class:`Pending`   - not terminal yet (maybe with Sume's ``next_poll_after_seconds``);
* :class:`Terminal`  - terminal, by its status (``terminal: false`` never overrides a terminal
  status; ``terminal: true`` beside a status this project does not know is :class:`Pending` with
  ``unknown_status``: the contract says an unknown status is not terminal);
* :class:`Result`    - a completed job's result: any JSON value (its shape varies by job type),
  parsed when it is small; a larger one is a :class:`ResultStream` of the bytes as Sume sends
  them (the caller streams it to S3, never holding it whole), and one whose ``Content-Length``
  passes the client's maximum is :class:`Oversized` (nothing read);
* :class:`Listing`   - one page of ``GET /jobs``;
* :class:`Retryable` - a transient fault (timeout, 408/409/425/429, 5xx, a garbage body), with
  Sume's ``Retry-After`` when it sent one;
* :class:`Refused`   - Sume said no: ``why`` is "key" (401: the key), "forbidden" (403: this
  job's workspace, or the key's - the caller checks which), "not_found" (404), "credits"
  (402) or "request" (another 4xx: the caller retries it, see :mod:`sume_poller.poll.poller`).

:class:`Retryable` and :class:`Refused` live here; each route's own outcomes live in a module of
their own, imported by the call that makes them, so a function creates only the classes of the
routes it calls (a value class costs about 0.1 ms of a Python 3.13 cold start): a job's status
and result in :mod:`.status`, a page of the list in :mod:`.listing`, a create in :mod:`.created`.

Every outcome carries the reply's rate-limit headers (:class:`~sume_poller.limits.budget.RateInfo`).
Each call is bounded by a total time (the caller's ``timeout`` for it); urllib3 retries once, and
only connect errors, where no request reached Sume. The API key is never logged; neither are
result URLs or payloads.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urlencode

import urllib3
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.util import Retry, Timeout

from ..core.jobs import CREATE_PATHS
from ..core.values import value
from ..limits.budget import RateInfo

if TYPE_CHECKING:  # each route's outcomes are imported by the call that makes them (see above)
    from .created import CreateOutcome
    from .listing import ListOutcome
    from .status import ResultOutcome, StatusOutcome

MAX_RETRY_AFTER = 86_400.0
#: Status and list replies above this are garbage; results may be much larger.
MAX_BODY = 1_000_000
MAX_RESULT_BODY = 50_000_000
_NO_RATE = RateInfo()


@value
class Retryable:
    """A transient failure (throttled, 5xx, transport): read again, after ``retry_after`` if given."""

    reason: str
    retry_after: float | None = None
    http_status: int | None = None
    request_id: str | None = None
    rate: RateInfo = _NO_RATE


@value
class Refused:
    """Sume refused the request for good (the key, forbidden, not found, credits, a bad request)."""

    why: str  # "key" | "forbidden" | "not_found" | "credits" | "request"
    http_status: int
    code: str | None = None
    message: str | None = None
    request_id: str | None = None
    rate: RateInfo = _NO_RATE


_REFUSALS = {401: "key", 402: "credits", 403: "forbidden", 404: "not_found"}


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date), capped at a day."""
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


def _int_header(headers: Mapping[str, str], name: str) -> int | None:
    try:
        value = int(float(headers.get(name, "")))
    except (TypeError, ValueError, OverflowError):
        return None
    return value if value >= 0 else None


def parse_rate(headers: Mapping[str, str]) -> RateInfo:
    """``RateLimit-Limit``/``-Remaining``/``-Reset``, ``RateLimit-Policy`` (``120;w=60, ...``)
    and ``Retry-After``; anything unparseable is left out."""
    policy: list[tuple[int, int]] = []
    for part in (headers.get("RateLimit-Policy") or "").split(","):
        limit, _, rest = part.strip().partition(";")
        window = rest.strip().removeprefix("w=") if rest.strip().startswith("w=") else ""
        if limit.strip().isdigit() and window.isdigit():
            policy.append((int(window), int(limit)))
    reset = _int_header(headers, "RateLimit-Reset")
    return RateInfo(limit=_int_header(headers, "RateLimit-Limit"),
                    remaining=_int_header(headers, "RateLimit-Remaining"),
                    reset=None if reset is None else float(reset), policy=tuple(policy),
                    retry_after=parse_retry_after(headers.get("Retry-After")))


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


@value
class _Reply:
    """One HTTP reply as the client got it (status None: no reply at all)."""

    status: int | None  # None: no reply (transport failure)
    body: Any
    headers: Mapping[str, str]
    error: str | None = None

    @property
    def request_id(self) -> str | None:
        rid = self.body.get("request_id") if isinstance(self.body, dict) else None
        return rid if isinstance(rid, str) else self.headers.get("X-Request-Id")


class JobReader(Protocol):
    """What the poll function reads a job with: :class:`SumeClient`, or the stand-in of a key the
    configuration no longer holds (``wiring.poll.RemovedKey``). Typed, so a stand-in that drifts
    from the client's signatures fails the type check instead of raising at the first read."""

    result_max_bytes: int

    def get_status(self, job_id: str, *, timeout: float | None = None) -> StatusOutcome: ...

    def get_result(self, job_id: str, *, timeout: float | None = None, inline_limit: int = MAX_BODY,
                   time_left: Callable[[], float] | None = None) -> ResultOutcome: ...

    def list_jobs(self, *, limit: int, cursor: str | None = None, type_: str | None = None,
                  status: str | None = None, timeout: float | None = None) -> ListOutcome: ...


class SumeClient:
    """A thread-safe Sume client; build one per container and reuse it."""

    def __init__(self, base_url: str, api_key: Callable[[], str], *, connect_timeout: float = 3.0,
                 read_timeout: float = 10.0, pool_size: int = 16,
                 on_key_rejected: Callable[[], None] | None = None, result_max_bytes: int = MAX_RESULT_BODY) -> None:
        self._base = base_url.rstrip("/")
        self.result_max_bytes = result_max_bytes
        self._api_key = api_key
        self._on_key_rejected = on_key_rejected
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._http = urllib3.PoolManager(
            num_pools=4, maxsize=pool_size, block=False,
            # One in-process retry, and only where no request reached Sume (connect errors):
            # a read timeout or a status is never retried here, so one call = one Sume read.
            retries=Retry(total=1, connect=1, read=0, status=0, other=0, redirect=0, raise_on_status=False),
            headers={"Accept": "application/json", "User-Agent": "sume-poller/2"},
        )

    # -- transport ------------------------------------------------------------------------------
    def _timeout(self, seconds: float | None) -> Timeout:
        if seconds is None:
            return Timeout(connect=self.connect_timeout, read=self.read_timeout)
        seconds = max(0.05, seconds)
        return Timeout(total=seconds, connect=min(self.connect_timeout, seconds), read=min(self.read_timeout, seconds))

    def _send(self, method: str, path: str, *, timeout: float | None, body: Mapping[str, Any] | None = None,
              headers: Mapping[str, str] | None = None) -> Any:
        """The response, unread (raises urllib3's errors)."""
        hdrs = {"Authorization": f"Bearer {self._api_key()}", **(headers or {})}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        return self._http.request(method, self._base + path, body=payload, headers=hdrs,
                                  preload_content=False, timeout=self._timeout(timeout))

    @staticmethod
    def _parse(response: Any, raw: bytes, limit: int) -> _Reply:
        if len(raw) > limit:
            return _Reply(response.status, _MALFORMED, response.headers)
        try:
            parsed = json.loads(raw) if raw else _MALFORMED
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            parsed = _MALFORMED
        return _Reply(response.status, parsed, response.headers)

    def _request(self, method: str, path: str, *, timeout: float | None, body: Mapping[str, Any] | None = None,
                 headers: Mapping[str, str] | None = None, limit: int = MAX_BODY) -> _Reply:
        try:
            resp = self._send(method, path, timeout=timeout, body=body, headers=headers)
        except Urllib3Error as exc:
            return _Reply(None, None, {}, type(getattr(exc, "reason", None) or exc).__name__)
        try:
            raw = resp.read(limit + 1)
        except Urllib3Error as exc:
            return _Reply(None, None, {}, type(exc).__name__)
        finally:
            resp.release_conn()
        return self._parse(resp, raw, limit)

    def _failure(self, reply: _Reply) -> Retryable | Refused:
        rate = parse_rate(reply.headers)
        if reply.status is None:
            return Retryable(f"transport:{reply.error}")
        code, message, request_id = _error_fields(reply.body)
        request_id = request_id or reply.headers.get("X-Request-Id")
        status = reply.status
        if status in (408, 409, 425, 429) or status >= 500:
            return Retryable(code or f"http_{status}", rate.retry_after, status, request_id, rate)
        if status == 401 and self._on_key_rejected:
            self._on_key_rejected()
        return Refused(_REFUSALS.get(status, "request"), status, code, message, request_id, rate)

    # -- API ------------------------------------------------------------------------------------
    def get_status(self, job_id: str, timeout: float | None = None) -> StatusOutcome:
        """``GET /jobs/{id}``; ``timeout``: real seconds this call may take in all."""
        from .status import interpret_status

        reply = self._request("GET", f"/jobs/{quote(job_id, safe='')}", timeout=timeout)
        if reply.status != 200:
            return self._failure(reply)
        return interpret_status(reply.body, reply.request_id, parse_rate(reply.headers))

    def get_result(self, job_id: str, timeout: float | None = None, *, inline_limit: int = MAX_BODY,
                   time_left: Callable[[], float] | None = None) -> ResultOutcome:
        """``GET /jobs/{id}/result``: any JSON value is a result. A body up to ``inline_limit``
        bytes is read and parsed (:class:`Result`); a larger one comes back unread as a
        :class:`ResultStream` (read it within ``time_left()`` real seconds, at most the client's
        ``result_max_bytes``); a ``Content-Length`` above that maximum is :class:`Oversized`."""
        from .status import Oversized, Result, ResultStream

        try:
            resp = self._send("GET", f"/jobs/{quote(job_id, safe='')}/result", timeout=timeout)
        except Urllib3Error as exc:
            return Retryable(f"transport:{type(getattr(exc, 'reason', None) or exc).__name__}")
        streaming = False
        try:
            rate = parse_rate(resp.headers)
            length = _int_header(resp.headers, "Content-Length")
            if resp.status == 200 and length is not None and length > self.result_max_bytes:
                return Oversized(length, resp.headers.get("X-Request-Id"), rate)
            # A body Sume says is large streams from its first byte; without a length, the first
            # inline_limit + 1 bytes tell (and lead the stream).
            large = resp.status == 200 and length is not None and length > inline_limit
            head = b"" if large else resp.read(inline_limit + 1 if resp.status == 200 else MAX_BODY + 1)
            if large or (resp.status == 200 and len(head) > inline_limit):
                streaming = True
                return ResultStream(head, resp, content_type=resp.headers.get("Content-Type") or "application/json",
                                    length=length, max_bytes=self.result_max_bytes,
                                    time_left=time_left or (lambda: math.inf),
                                    request_id=resp.headers.get("X-Request-Id"), rate=rate)
        except Urllib3Error as exc:
            return Retryable(f"transport:{type(exc).__name__}")
        finally:
            if not streaming:
                resp.release_conn()
        reply = self._parse(resp, head, MAX_BODY if resp.status != 200 else inline_limit)
        if reply.status != 200:
            return self._failure(reply)
        if reply.body is _MALFORMED:
            return Retryable("malformed_body", http_status=200, request_id=reply.request_id, rate=rate)
        return Result(reply.body, reply.request_id, rate)

    def list_jobs(self, *, limit: int, cursor: str | None = None, type_: str | None = None,
                  status: str | None = None, timeout: float | None = None) -> ListOutcome:
        """``GET /jobs`` with the given filters: one page."""
        from .listing import Listing

        query = {k: v for k, v in (("limit", str(limit)), ("cursor", cursor), ("type", type_),
                                   ("status", status)) if v is not None}
        reply = self._request("GET", "/jobs?" + urlencode(query), timeout=timeout)
        if reply.status != 200:
            return self._failure(reply)
        body = reply.body
        items = body.get("jobs", body.get("data")) if isinstance(body, dict) else None
        if not isinstance(items, list):
            return Retryable("malformed_body", http_status=200, rate=parse_rate(reply.headers))
        cursor_fields = [f for f in ("next_cursor", "cursor", "next") if isinstance(body, dict) and f in body]
        raw_cursor = body.get(cursor_fields[0]) if cursor_fields else None
        return Listing(tuple(i for i in items if isinstance(i, dict)),
                       raw_cursor if isinstance(raw_cursor, str) and raw_cursor else None,
                       bool(cursor_fields), parse_rate(reply.headers))

    def create(self, kind: str, params: Mapping[str, Any], idempotency_key: str,
               timeout: float | None = None) -> CreateOutcome:
        """Start a paid job. Always sends ``Idempotency-Key``; retry only with the same key."""
        from .created import Created, extract_job_ids

        reply = self._request("POST", CREATE_PATHS[kind], body=params, timeout=timeout,
                              headers={"Idempotency-Key": idempotency_key})
        if reply.status is None:
            return Retryable(f"transport:{reply.error}")  # outcome unknown: retry with the same key
        if reply.status not in (200, 201, 202):
            return self._failure(reply)
        ids = extract_job_ids(reply.body)
        if not ids:
            return Retryable("create_reply_without_job_id", http_status=reply.status)
        replayed = str(reply.headers.get("Idempotent-Replayed", "")).lower() == "true"
        return Created(ids, reply.request_id, replayed, parse_rate(reply.headers))


class _Malformed:
    def __repr__(self) -> str:
        return "<malformed body>"


_MALFORMED: Any = _Malformed()
