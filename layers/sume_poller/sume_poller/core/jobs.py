"""Pure job facts: ids, kinds, statuses, retry delays, index partitions. No I/O."""

from __future__ import annotations

import random
import re
from enum import StrEnum
from typing import TypeGuard

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
#: Sume's own ``type`` values for each kind (the list route filters on them).
SUME_TYPES: dict[str, str] = {
    "image": "image_generation",
    "video": "video_generation",
    "ad_video": "ad_video_generation",
    "face_swap": "face_swap",
    "reference_analysis": "reference_analysis",
}


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


#: A Sume key's id (:mod:`sume_poller.config.keys`): what records, messages, metrics and Redis names carry.
KEY_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")


def valid_key_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and KEY_ID_RE.fullmatch(value) is not None


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

#: Terminal statuses this project records (``timed_out`` is ours: the job's deadline).
TERMINAL_STATUSES = frozenset({"completed", "failed", "canceled", "expired", "timed_out"})
PENDING = "pending"


class Evidence(StrEnum):
    """What a terminal record rests on (its ``evidence`` attribute): only these make a job terminal.

    * ``status_read`` - the job's own status route: a terminal status, or a refusal the contract
      names for a job read (403 another workspace's job, 404 past the read-after-create grace), or a
      refusal the contract does not name, repeated over the refusal window; a completed status whose
      result route kept refusing the result over that window (recorded ``completed``, error
      ``result_refused``);
    * ``result_read`` - the job's result route answered the result (the proof of ``completed``);
    * ``webhook`` - a verified signed delivery stated a failure (Sume's own word, no read);
    * ``deadline`` - the job's deadline passed (``timed_out``, after one last read);
    * ``key_removed`` - the job's Sume key left the key configuration (no read: there is no key).
    """

    STATUS = "status_read"
    RESULT = "result_read"
    WEBHOOK = "webhook"
    DEADLINE = "deadline"
    KEY_REMOVED = "key_removed"


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

    A status this project does not know is never terminal on a job read
    (:func:`sume_poller.sume.client.interpret_status`); where something else names one terminal (a verified
    webhook's ``*.failed`` event), it is ``completed`` when ``succeeded`` says so, else ``failed``.
    """
    s = status.strip().lower() if isinstance(status, str) else ""
    if s in _SUCCESS:
        return "completed"
    if s in _FAILURE:
        return _FAILURE[s]
    return "completed" if succeeded else "failed"


#: Backoff after a transient Sume fault (seconds): exponential, jittered, capped.
MAX_ERROR_DELAY = 300.0
#: Backoff while a completed job's result is not ready yet (seconds): 5, 10, 20, ... capped.
RESULT_WAIT_FIRST = 5.0
MAX_RESULT_WAIT = 600.0
_JITTER = 0.2


def _jittered(base: float, rng: random.Random | None) -> float:
    return base * (rng or random).uniform(1 - _JITTER, 1 + _JITTER)


def error_delay(errors: int, retry_after: float | None, rng: random.Random | None = None) -> float:
    """Seconds to wait after the ``errors``-th transient fault in a row: ``Retry-After`` when
    Sume sent one, else 2, 4, 8, ... capped at 5 minutes, with jitter."""
    if retry_after is not None and retry_after >= 0:
        return max(1.0, retry_after)
    return min(_jittered(2.0 ** max(errors, 1), rng), MAX_ERROR_DELAY)


def result_wait_delay(waits: int, rng: random.Random | None = None) -> float:
    """Seconds until the next result fetch of a completed job whose result is not ready yet."""
    return min(_jittered(RESULT_WAIT_FIRST * 2.0 ** max(waits, 0), rng), MAX_RESULT_WAIT)


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


def keyed_shard(shard: str, key: str | None) -> str:
    """A pending partition of one Sume key's jobs: the default key's (``key`` None) are ``pNN``,
    another key's ``pNN:<key>`` - fan-out reads each key's partitions within that key's budget."""
    return shard if key is None else f"{shard}:{key}"


def all_shards(shards: int) -> list[str]:
    """Every partition fan-out reads: the pending ones, then the outbox ones."""
    return [f"{prefix}{i:02d}" for prefix in (PENDING_PREFIX, OUTBOX_PREFIX) for i in range(shards)]
