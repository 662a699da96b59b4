"""Pure job logic: ids, statuses, delays. No I/O here, so it is unit-tested directly."""

from __future__ import annotations

import math
import random
import re
from enum import StrEnum

#: Sume job ids look like ``job_<hex>``. Anything outside this shape never reaches a Redis key,
#: a URL path or a DynamoDB key: no separators, no dots (``..``), no spaces, no unicode.
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,127}$")

#: Kinds of job and the create endpoint of each.
CREATE_PATHS: dict[str, str] = {
    "image": "/images/generations",
    "video": "/videos/generations",
    "ad_video": "/ads/videos",
    "face_swap": "/face-swap",
    "reference_analysis": "/reference-analysis",
}
KINDS = frozenset(CREATE_PATHS)
LONG_KINDS = frozenset({"video", "ad_video"})


class InvalidJobId(ValueError):
    pass


def validate_job_id(value: object) -> str:
    """Return ``value`` if it is a safe Sume job id, else raise :class:`InvalidJobId`."""
    if not isinstance(value, str):
        raise InvalidJobId(f"job id must be a string, not {type(value).__name__}")
    if not JOB_ID_RE.fullmatch(value):
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise InvalidJobId(f"job id {shown!r} is not 1-128 characters of A-Z a-z 0-9 _ -")
    return value


class State(StrEnum):
    ACTIVE = "active"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"


_ACTIVE = frozenset({"queued", "running", "processing", "pending"})
_SUCCESS = frozenset({"completed", "complete", "succeeded", "success", "ready"})
#: Failure statuses and the canonical status this project records for each.
_FAILURE = {
    "failed": "failed",
    "error": "failed",
    "errored": "failed",
    "canceled": "canceled",
    "cancelled": "canceled",
    "expired": "expired",
}

#: Terminal statuses this project records (``timed_out`` is ours: deadline or attempt cap).
TERMINAL_STATUSES = frozenset({"completed", "failed", "canceled", "expired", "timed_out"})
PENDING = "pending"


def classify_status(status: object) -> State:
    """Classify a Sume status string, case-insensitively."""
    if not isinstance(status, str):
        return State.UNKNOWN
    s = status.strip().lower()
    if s in _ACTIVE:
        return State.ACTIVE
    if s in _SUCCESS:
        return State.SUCCEEDED
    if s in _FAILURE:
        return State.FAILED
    return State.UNKNOWN


def canonical_terminal_status(status: object, succeeded: bool | None = None) -> str:
    """The status recorded for a terminal Sume status (``completed``/``failed``/``canceled``/``expired``).

    A status Sume marks terminal but that this project does not know is recorded as ``completed``
    when the reply says a result is ready, else ``failed``; the raw status is kept beside it.
    """
    s = status.strip().lower() if isinstance(status, str) else ""
    if s in _SUCCESS:
        return "completed"
    if s in _FAILURE:
        return _FAILURE[s]
    return "completed" if succeeded else "failed"


# Client-side schedules used when Sume sends no ``next_poll_after_seconds``: short for
# images, longer for video. Index by attempt; the last value repeats.
_SHORT_SCHEDULE = (2, 3, 5, 8, 13, 20, 30)
_LONG_SCHEDULE = (10, 15, 20, 30, 45, 60)
_JITTER = 0.2
MAX_ERROR_DELAY = 300


def _jittered(base: float, rng: random.Random | None) -> int:
    r = rng or random
    return max(1, math.ceil(base * r.uniform(1 - _JITTER, 1 + _JITTER)))


def backoff_delay(kind: str | None, attempt: int, rng: random.Random | None = None) -> int:
    """Seconds until the next status read when Sume gave no hint (jittered, at least 1)."""
    schedule = _LONG_SCHEDULE if kind in LONG_KINDS else _SHORT_SCHEDULE
    base = schedule[min(max(attempt, 0), len(schedule) - 1)]
    return _jittered(base, rng)


def error_delay(errors: int, retry_after: float | None, rng: random.Random | None = None) -> int:
    """Seconds to wait after a transient Sume fault: ``Retry-After`` when given, else
    exponential backoff (2, 4, 8, ... capped at 5 minutes) with jitter."""
    if retry_after is not None and retry_after >= 0:
        return max(1, math.ceil(retry_after))
    base = min(2.0 ** max(errors, 1), MAX_ERROR_DELAY)
    return min(_jittered(base, rng), MAX_ERROR_DELAY)


def hint_delay(next_poll_after: float) -> int:
    """Whole seconds for SQS from Sume's ``next_poll_after_seconds`` (rounded up, at least 1)."""
    return max(1, math.ceil(next_poll_after))


def hop_delay(remaining_seconds: float, max_delay: int) -> int:
    """The next SQS DelaySeconds toward a due time ``remaining_seconds`` away (<= max_delay)."""
    return max(0, min(math.ceil(remaining_seconds), max_delay))


# The sparse index "pending" has two kinds of partition: ``pNN`` holds the jobs still pending,
# ``oNN`` the terminal jobs whose terminal event is not published yet (the outbox). Both are
# read by fan-out; publishing the event takes the job out of the index.
PENDING_PREFIX = "p"
OUTBOX_PREFIX = "o"


def shard_of(job_id: str, shards: int, prefix: str = PENDING_PREFIX) -> str:
    """The index partition of a job (stable; spreads writes over ``shards`` keys)."""
    h = 0
    for ch in job_id.encode():
        h = (h * 31 + ch) & 0xFFFFFFFF
    return f"{prefix}{h % shards:02d}"


def all_shards(shards: int) -> list[str]:
    """Every partition fan-out reads: the pending ones, then the outbox ones."""
    return [f"{prefix}{i:02d}" for prefix in (PENDING_PREFIX, OUTBOX_PREFIX) for i in range(shards)]
