"""A job's own routes' outcomes: ``GET /jobs/{id}`` (:class:`Pending`, :class:`Terminal`) and
``GET /jobs/{id}/result`` (:class:`Result`, :class:`ResultStream`, :class:`Oversized`), beside the
shared :class:`~.client.Retryable` and :class:`~.client.Refused` (see :mod:`.client`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any

from urllib3.exceptions import HTTPError as Urllib3Error

from ..core.jobs import State, canonical_terminal_status, classify_status
from ..core.values import value
from ..limits.budget import RateInfo
from .client import _NO_RATE, Refused, Retryable, _number


@value
class Pending:
    """The job is not terminal yet: its status and Sume's hint for the next read."""

    status: str
    next_poll_after: float | None = None
    unknown_status: bool = False
    request_id: str | None = None
    rate: RateInfo = _NO_RATE


@value
class Terminal:
    """The job is terminal: its canonical status, Sume's own word, whether its result is ready."""

    status: str  # canonical: completed | failed | canceled | expired
    sume_status: str
    result_ready: bool
    error: dict[str, str] | None = None
    request_id: str | None = None
    next_poll_after: float | None = None
    rate: RateInfo = _NO_RATE
    #: The reply carried ``result_ready`` (Sume's gate for the result fetch): a wait for the
    #: result then reads the status; without it a completed job's result is assumed ready.
    gated: bool = False


@value
class Result:
    """A terminal job's result, read inline."""

    payload: Any = field(repr=False)
    request_id: str | None = None
    rate: RateInfo = _NO_RATE


class BodyTooLarge(Exception):
    """A result body grew past the client's maximum while it was read (``size``: bytes seen)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"result body larger than {size} bytes")
        self.size = size


class StreamTimeout(Exception):
    """A result body could not be read within the time the caller had left."""


class ResultStream:
    """A large result body as Sume sends it, read in pieces (a file-like ``read(n)``); counts its
    bytes, stops past ``max_bytes`` (:class:`BodyTooLarge`) or when ``time_left()`` runs low
    (:class:`StreamTimeout`). Use it as a context manager: leaving closes the connection."""

    def __init__(self, head: bytes, response: Any, *, content_type: str, length: int | None, max_bytes: int,
                 time_left: Callable[[], float], request_id: str | None, rate: RateInfo) -> None:
        self._head = head
        self._response = response
        self.content_type = content_type
        self.length = length
        self.max_bytes = max_bytes
        self._time_left = time_left
        self.request_id = request_id
        self.rate = rate
        self.size = 0

    def read(self, amount: int = -1) -> bytes:
        """Up to ``amount`` bytes (fewer only at the end); all that is left when ``amount`` < 0
        (s3transfer reads a body below its multipart threshold so: still bounded by ``max_bytes``)."""
        wanted = self.max_bytes + 1 - self.size if amount < 0 else amount
        parts = []
        if self._head:
            parts.append(self._head[:wanted])
            self._head = self._head[wanted:]
            wanted -= len(parts[0])
        if wanted > 0:
            if self._time_left() <= 0:
                raise StreamTimeout("no time left to read the result")
            try:  # one read: urllib3 returns ``wanted`` bytes unless the body ends, in one bytes object
                parts.append(self._response.read(wanted))
            except Urllib3Error as exc:
                raise StreamTimeout(f"reading the result failed ({type(exc).__name__})") from exc
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self.size += len(data)
        if self.size > self.max_bytes:
            raise BodyTooLarge(self.size)
        return data

    def __enter__(self) -> ResultStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._response.close()  # a body not read to its end cannot go back to the pool
        self._response.release_conn()


@value
class Oversized:
    """A result whose ``Content-Length`` passes the client's maximum: nothing was read."""

    size: int
    request_id: str | None = None
    rate: RateInfo = _NO_RATE


StatusOutcome = Pending | Terminal | Retryable | Refused
ResultOutcome = Result | ResultStream | Oversized | Retryable | Refused


def interpret_status(body: Any, request_id: str | None = None, rate: RateInfo = _NO_RATE) -> StatusOutcome:
    """Turn a 200 reply of ``GET /jobs/{id}`` into an outcome (pure; unit-tested)."""
    if not isinstance(body, dict):
        return Retryable("malformed_body", http_status=200, request_id=request_id, rate=rate)
    inner = body.get("job")
    job: dict[str, Any] = inner if isinstance(inner, dict) else body
    status = job.get("status")
    if not isinstance(status, str) or not status.strip():
        return Retryable("missing_status", http_status=200, request_id=request_id, rate=rate)
    status = status.strip().lower()[:64]

    def hint(name: str) -> Any:
        return job[name] if name in job else body.get(name)

    result_ready = hint("result_ready")
    next_poll = _number(hint("next_poll_after_seconds"))
    state = classify_status(status)
    # A terminal status is terminal whatever the flag says. A status this project does not know is
    # not terminal, ``terminal: true`` or not (the contract's rule: keep reading, report it loudly).
    if state not in (State.SUCCEEDED, State.FAILED):
        return Pending(status, next_poll, state is State.UNKNOWN, request_id, rate)
    canonical = canonical_terminal_status(status)
    error = None
    raw_error = job.get("error")
    if canonical != "completed" and isinstance(raw_error, dict):
        error = {k: str(raw_error[k])[:300] for k in ("code", "message") if isinstance(raw_error.get(k), str | int)}
    gated = isinstance(result_ready, bool)
    ready = canonical == "completed" and (result_ready if gated else True)
    return Terminal(canonical, status, ready, error or None, request_id, next_poll, rate, gated)
