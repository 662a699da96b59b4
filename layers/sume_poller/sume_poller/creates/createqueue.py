"""The create queue: submissions a key's create budget cannot take now, kept in arrival order.

A submission the create budget cannot take at once is *queued*, not refused: it is kept in the job
table and created later, in arrival order per key, as that key's create budget allows - each
create with the submission's own Idempotency-Key, so a retry never bills twice. The queue's items and submission records
are the table's (:mod:`sume_poller.store.submissions`).

A *drain* creates a key's queue head by head: one chain of SQS messages per key (the create
queue), each step holding the key's drain lease ``!drain:<key>`` (the chain protocol of
:mod:`sume_poller.limits.lease`: token, step, claim, rest, release), so one drain per key runs. Submit
starts the chain when it queues and the lease is free; fan-out restarts one that died. This module
holds what both share: the names, the drain message and the estimate of when a queued submission
is created.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict
from typing import Any

from ..core.jobs import valid_key_id
from ..core.values import value
from ..limits.budget import DAY, MINUTE, granted_per_window

#: A queued submission past its deadline: recorded rejected with this error, never created.
EXPIRED = "create_budget_exhausted"
#: A queued submission of a key the key configuration no longer holds.
KEY_REMOVED = "key_removed"
DRAIN_VERSION = 1
_TOKEN_RE = re.compile(r"^[0-9a-f]{32,64}$")
_MAX_COUNTER = 10_000_000


def drain_lease(key_id: str) -> str:
    """The name (after the lease prefix) of a key's drain lease."""
    return f"!drain:{key_id}"


class DrainMessageError(ValueError):
    """A create-queue message that cannot be processed (poison)."""


@value
class DrainMessage:
    """Step ``seq`` of the drain chain ``token`` of key ``key`` (None: the deployment's default
    key - messages name only the others, as poll messages do); ``errors``: transient create faults
    in a row at the queue's head (the backoff); ``slot``: the create slot (clock seconds) this
    step reserved before it re-queued itself to wait for it."""

    token: str
    seq: int = 0
    key: str | None = None
    errors: int = 0
    slot: float | None = None
    v: int = DRAIN_VERSION

    def to_json(self) -> str:
        body = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps({"drain": True, **body}, separators=(",", ":"))

    @classmethod
    def parse(cls, body: Any) -> DrainMessage:
        try:
            data = json.loads(body) if isinstance(body, str | bytes) else None
        except ValueError:
            data = None
        if not isinstance(data, dict) or data.pop("drain", None) is not True:
            raise DrainMessageError("not a drain message")
        if set(data) - {"key", "token", "seq", "errors", "slot", "v"} or data.get("v") != DRAIN_VERSION:
            raise DrainMessageError(f"unknown fields or version: {sorted(data)}")
        key, token, seq, errors, slot = (data.get("key"), data.get("token"), data.get("seq", 0),
                                         data.get("errors", 0), data.get("slot"))
        if (key is not None and not valid_key_id(key)) or not isinstance(token, str) or not _TOKEN_RE.fullmatch(token):
            raise DrainMessageError("a drain message names a chain token (and a key id, but for the default key)")
        for n in (seq, errors):
            if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= _MAX_COUNTER:
                raise DrainMessageError("seq and errors are small non-negative integers")
        if slot is not None and (isinstance(slot, bool) or not isinstance(slot, int | float) or not
                                 math.isfinite(slot) or slot < 0):
            raise DrainMessageError("slot is a clock time in seconds")
        return cls(token, seq, key, errors, None if slot is None else float(slot))


def next_day_window(now: float) -> float:
    """The end of the UTC day of ``now`` (where the limiter's day window ends unless Sume said)."""
    return (math.floor(now / DAY) + 1) * DAY


def estimate_create_at(now: float, ahead: int, first_wait: float, per_minute: int, per_day: int,
                       state: dict[str, float]) -> float:
    """When a queued submission with ``ahead`` others before it is created (clock seconds): the
    create budget's next free slot (``first_wait`` away), then one slot per submission ahead at
    the minute's pace (:func:`~sume_poller.limits.budget.granted_per_window`), and - once the day window
    (``state``: the budget's hash, clock ms) has no creates left for it - in the next day windows
    at that pace. An estimate: it assumes nothing else takes creates and no create is retried."""
    interval = MINUTE / granted_per_window(per_minute) if per_minute > 0 else 0.0
    at = now + first_wait + ahead * interval
    if per_day > 0:
        reset = state.get("day_reset", 0.0) / 1000
        used = int(state.get("day_used", 0.0)) if reset > now else 0
        reset = reset if reset > now else next_day_window(now)
        left = per_day - used
        if ahead >= left:  # ours falls in a later day window
            k = ahead - max(left, 0)
            at = max(at, reset + (k // per_day) * DAY + (k % per_day) * interval)
    return at
