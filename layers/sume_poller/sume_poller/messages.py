"""The poll message: what travels through SQS between polls of one job.

A chain is the sequence of messages that carry one lease token. ``seq`` fences the chain:
the lease holds ``"<token>:<seq>"`` for the one message allowed to act next, so a duplicate
or stale copy of an older message cannot renew it, and chains cannot multiply.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from .jobs import KINDS, InvalidJobId, validate_job_id

VERSION = 1
MAX_BODY_BYTES = 4096
_TOKEN_RE = re.compile(r"^[0-9a-f]{32,64}$")
_MAX_COUNTER = 10_000_000


class MessageError(ValueError):
    """A poll message that cannot be processed (it is poison: retrying will not help)."""


@dataclass(frozen=True, slots=True)
class PollMessage:
    job_id: str
    kind: str
    deadline_at: int
    due_at: float
    token: str | None = None  # None: not part of a chain yet (from submit or fan-out)
    seq: int = 0
    attempt: int = 0  # Sume status reads this chain has made
    errors: int = 0  # consecutive transient faults, for backoff
    v: int = VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @property
    def lease_value(self) -> str | None:
        """What the lease holds while this message is the chain's next step."""
        return None if self.token is None else f"{self.token}:{self.seq}"

    def next(self, **changes: Any) -> PollMessage:
        return replace(self, **changes)


def _int_field(data: dict[str, Any], name: str, default: int | None = None) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MessageError(f"{name} must be an integer")
    if not 0 <= value <= (2**40 if name == "deadline_at" else _MAX_COUNTER):
        raise MessageError(f"{name} out of range")
    return value


def parse_message(body: object) -> PollMessage:
    """Parse and validate an SQS body; raise :class:`MessageError` with a clear reason."""
    if not isinstance(body, str):
        raise MessageError("body is not a string")
    if len(body.encode("utf-8", "surrogatepass")) > MAX_BODY_BYTES:
        raise MessageError(f"body is larger than {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise MessageError(f"body is not JSON: {str(exc)[:80]}") from None
    if not isinstance(data, dict):
        raise MessageError("body is not a JSON object")
    if data.get("v") != VERSION:
        raise MessageError(f"unsupported message version {data.get('v')!r}")
    unknown = set(data) - set(PollMessage.__dataclass_fields__)
    if unknown:
        raise MessageError(f"unknown fields {sorted(unknown)[:5]}")
    try:
        job_id = validate_job_id(data.get("job_id"))
    except InvalidJobId as exc:
        raise MessageError(str(exc)) from None
    kind = data.get("kind")
    if kind not in KINDS:
        raise MessageError(f"kind must be one of {sorted(KINDS)}")
    token = data.get("token")
    if token is not None and (not isinstance(token, str) or not _TOKEN_RE.fullmatch(token)):
        raise MessageError("token must be null or 32-64 lowercase hex characters")
    due_at = data.get("due_at")
    if isinstance(due_at, bool) or not isinstance(due_at, int | float) or not math.isfinite(due_at):
        raise MessageError("due_at must be a finite number")
    if not 0 <= due_at < 2**40:
        raise MessageError("due_at out of range")
    seq = _int_field(data, "seq", 0)
    if token is None and seq != 0:
        raise MessageError("seq without a token")
    return PollMessage(
        job_id=job_id,
        kind=kind,
        deadline_at=_int_field(data, "deadline_at"),
        due_at=float(due_at),
        token=token,
        seq=seq,
        attempt=_int_field(data, "attempt", 0),
        errors=_int_field(data, "errors", 0),
    )
