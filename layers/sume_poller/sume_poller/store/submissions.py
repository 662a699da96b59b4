"""Submissions in the job table: the create queue's items and the submission records (``#`` items,
never jobs). The create queue itself (its drain, the drain message) is :mod:`sume_poller.creates`'s;
this module is the table's schema of it, which the store reads and writes::

    #q:<key>:<arrival ms, 15 digits>:<16 hex of the key's hash>   the queue item: in partition
        pending_shard "q:<key>" of the sparse index "pending", whose RANGE (job_id) is the arrival
        order; key, kind, params (JSON text, as the create sends them), idempotency_key,
        derived_key, arrived_at, deadline_at
    #sub:<key>:<idempotency key>                                     the submission record:
        status queued | created | rejected, job_ids, error, queue_item, request_id, ...;
        unknown_creates (creates sent whose answer is not known yet: noted before each is sent,
        taken back after a 429 or the key's refusal), create_attempts, last_create_at. Before a
        submission is queued or settled, its record may be an *attempt record*: no status, only
        these counters (submit's own creates noted before they were sent).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

QUEUE_PREFIX = "q:"
QUEUE_ITEM_PREFIX = "#q:"
SUBMISSION_PREFIX = "#sub:"
QUEUED, CREATED, REJECTED = "queued", "created", "rejected"
#: The submission record's count of creates sent whose outcome is not known (Sume may have billed them).
UNKNOWN_CREATES = "unknown_creates"


def queue_shard(key_id: str) -> str:
    """The pending-index partition of a key's queue."""
    return f"{QUEUE_PREFIX}{key_id}"


def queue_item_id(key_id: str, arrived: float, idempotency_key: str) -> str:
    """A queue item's id: its key, arrival (clock ms, zero-padded: the index's RANGE sorts them in
    arrival order; rounded, not truncated: a float clock time just below a millisecond is that
    millisecond) and a hash of its idempotency key (two arrivals in one millisecond: their order
    is the hashes', as between concurrent callers)."""
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:16]
    return f"{QUEUE_ITEM_PREFIX}{key_id}:{round(arrived * 1000):015d}:{digest}"


def submission_id(key_id: str, idempotency_key: str) -> str:
    """The submission record of one idempotency key of one Sume key."""
    return f"{SUBMISSION_PREFIX}{key_id}:{idempotency_key}"


def queue_item(key_id: str, *, kind: str, params: dict[str, Any], idempotency_key: str, derived: bool,
               arrived: float, deadline_at: float) -> dict[str, Any]:
    """A queue item: in its key's partition of the index, in arrival order."""
    return {"job_id": queue_item_id(key_id, arrived, idempotency_key), "pending_shard": queue_shard(key_id),
            "key": key_id, "kind": kind, "params": json.dumps(params, separators=(",", ":"), sort_keys=True),
            "idempotency_key": idempotency_key, "derived_key": derived, "arrived_at": round(arrived, 3),
            "deadline_at": math.ceil(deadline_at)}


def queued_record(item: dict[str, Any]) -> dict[str, Any]:
    """The submission record of a queue item, while it waits."""
    return {"job_id": submission_id(item["key"], item["idempotency_key"]), "status": QUEUED, "key": item["key"],
            "kind": item["kind"], "idempotency_key": item["idempotency_key"], "queue_item": item["job_id"],
            "derived_key": item["derived_key"], "arrived_at": item["arrived_at"], "deadline_at": item["deadline_at"],
            "job_ids": []}


def settled_record(key_id: str, kind: str, idempotency_key: str, status: str, *, now: float, derived: bool,
                   job_ids: list[str] | None = None, error: dict[str, str] | None = None,
                   **extra: Any) -> dict[str, Any]:
    """The submission record of one created or rejected without waiting."""
    return {"job_id": submission_id(key_id, idempotency_key), "status": status, "key": key_id, "kind": kind,
            "idempotency_key": idempotency_key, "derived_key": derived, "job_ids": job_ids or [], "error": error,
            "settled_at": round(now, 3), **extra}
