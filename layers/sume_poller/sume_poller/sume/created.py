"""The create route's outcome: ``POST`` of a kind's create path (see :mod:`.client`)."""

from __future__ import annotations

from typing import Any

from ..core.values import value
from ..limits.budget import RateInfo
from .client import _NO_RATE, Refused, Retryable


@value
class Created:
    """Sume created the job (or replayed the original one for a repeated Idempotency-Key)."""

    job_ids: tuple[str, ...]
    request_id: str | None = None
    #: Sume answered a repeated Idempotency-Key with the original job (nothing new was billed).
    replayed: bool = False
    rate: RateInfo = _NO_RATE


CreateOutcome = Created | Retryable | Refused


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
