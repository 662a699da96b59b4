"""The poll message: what travels through SQS between the steps of one job's chain.

A message is step ``seq`` of the chain ``token`` (see :mod:`sume_poller.limits.lease`). It carries the
job's own accounting, so a step needs no database read: when the next read is due, how many
reads the chain made, the bounds of the completion time seen so far, and - once Sume said the
job is terminal - that :class:`Finding`, so later steps fetch only the result and never read the
status again. Times are clock seconds.

Versions: v3 adds ``refused_since`` (when a per-job read's refusals the contract does not name
began: the refusal window's start); v2 is v3 without it; v1 is from before chains always had a
token and before the result phase. The encoder writes the lowest version that carries the message
(v2 unless ``refused_since`` is set), so the release before v3 reads nearly every message during a
deploy; all three are read. Unknown fields and versions are poison: they fail alone and reach the
dead-letter queue.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import field, fields, replace
from enum import StrEnum
from typing import Any

from .jobs import KINDS, Evidence, InvalidJobId, valid_key_id, validate_job_id
from .values import value

VERSION = 3
#: Each version's fields beyond v2's: a message that needs none of them is written as v2.
V3_ONLY = frozenset({"refused_since"})
MAX_BODY_BYTES = 4096
_TOKEN_RE = re.compile(r"^[0-9a-f]{32,64}$")
_PROFILE_RE = re.compile(r"^[A-Za-z0-9_|.:\-]{1,64}$")
_MAX_COUNTER = 10_000_000
_MAX_TIME = 2.0**40
_V1_FIELDS = frozenset({"v", "job_id", "kind", "deadline_at", "due_at", "token", "seq", "attempt", "errors"})
STATUS_PHASE = "status"
RESULT_PHASE = "result"
#: A terminal job whose outbox is unfinished (fan-out's message): no lease, no read, no slot.
OUTBOX_PHASE = "outbox"


class Source(StrEnum):
    """Who said a job is terminal."""

    #: The job's own status route: only it, the result route or a verified webhook makes a job terminal.
    STATUS = "status"
    #: A sweep's list page: it only brings a per-job read forward.
    LIST = "list"
    #: A verified signed delivery: Sume's own word for a failure; a ``*.ready`` one gets its result read.
    WEBHOOK = "webhook"


#: Who said a job is terminal: its own status route, a sweep's list page, or a webhook delivery.
SOURCES = tuple(Source)
_FINDING_FIELDS = ("status", "sume_status", "error", "source", "result_ready")


@value
class Finding:
    """What a chain knows of its job's end, and whose word it is (the message's ``outcome``).

    ``status`` is the canonical status said (completed, failed, canceled, expired), ``source`` who
    said it. ``result_ready`` is set only where the job's status reply carried that field (Sume's gate
    for the result fetch: the wait then reads the status). :meth:`next_read` is the one rule of what
    such a word still needs before anything is recorded. On the wire it is the JSON object
    ``{status, sume_status?, error?, source, result_ready?}`` (as v2 wrote it: :meth:`to_json`).
    """

    status: str
    source: Source
    sume_status: str | None = None
    error: dict[str, str] | None = None
    result_ready: bool | None = None

    def next_read(self) -> str | None:
        """What this word still needs before the job is recorded: None - nothing (a failure a verified
        signed webhook stated is Sume's own word); ``STATUS_PHASE`` - the job's status read (a failure
        only a list reported; a completed job whose status said ``result_ready: false``: Sume's gate);
        ``RESULT_PHASE`` - its result read (a completed job: the result is the proof)."""
        if self.status != "completed":
            return None if self.source is Source.WEBHOOK else STATUS_PHASE
        return STATUS_PHASE if self.result_ready is False else RESULT_PHASE

    @property
    def confirmed(self) -> bool:
        """Said by the job's own status route (a list's or a webhook's word is confirmed by a per-job read)."""
        return self.source is Source.STATUS

    @property
    def evidence(self) -> Evidence | None:
        """What a record made on this word alone rests on (None: a list's word never makes one)."""
        return {Source.STATUS: Evidence.STATUS, Source.WEBHOOK: Evidence.WEBHOOK}.get(self.source)

    def to_json(self) -> dict[str, Any]:
        values = {"status": self.status, "sume_status": self.sume_status, "error": self.error,
                  "source": self.source.value, "result_ready": self.result_ready}
        return {k: v for k, v in values.items() if v is not None}

    @classmethod
    def parse(cls, value: Any) -> Finding | None:
        """A message's ``outcome`` (None: absent); :class:`MessageError` with the reason otherwise."""
        if value is None:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("status"), str):
            raise MessageError("outcome must be an object with a status")
        error = value.get("error")
        if error is not None and not (isinstance(error, dict) and all(isinstance(v, str) for v in error.values())):
            raise MessageError("outcome.error must be an object of strings")
        unknown = set(value) - set(_FINDING_FIELDS)
        if unknown:
            raise MessageError(f"unknown outcome fields {sorted(unknown)[:5]}")
        # Before sources were recorded only sweeps wrote a failure outcome: without one it is the list's.
        source = value.get("source", "status" if value["status"] == "completed" else "list")
        if source not in SOURCES:
            raise MessageError(f"outcome.source must be one of {', '.join(SOURCES)}")
        ready = value.get("result_ready")
        if ready is not None and not isinstance(ready, bool):
            raise MessageError("outcome.result_ready must be a boolean")
        sume_status = value.get("sume_status")
        if sume_status is not None and not isinstance(sume_status, str):
            raise MessageError("outcome.sume_status must be a string")
        return cls(value["status"], Source(source), sume_status, error or None, ready)


class MessageError(ValueError):
    """A poll message that cannot be processed (it is poison: retrying will not help)."""


@value
class PollMessage:
    """One step of a job's chain as the poll queue carries it (the fields and versions: above)."""

    job_id: str
    kind: str
    deadline_at: int
    due_at: float
    token: str | None = None  # None only in v1 messages; a claim starts a chain for them
    seq: int = 0
    submitted_at: int | None = None
    profile: str | None = None
    reads: int = 0  # status reads of this job so far
    result_reads: int = 0
    errors: int = 0  # consecutive transient faults, for backoff
    seen_running_at: float | None = None  # the last read that saw the job running
    phase: str = STATUS_PHASE
    #: In the result phase: what was said of the terminal job, and by whom (:class:`Finding`).
    outcome: Finding | None = None
    seen_terminal_at: float | None = None
    result_waits: int = 0
    #: A read slot the budget reserved for this step (clock seconds).
    slot_at: float | None = None
    #: Who learned the job is finished ("sweep", "webhook"); None: the chain itself.
    found_by: str | None = None
    #: A stretched step's normal due time: it reads then if sweeps stop covering its kind.
    normal_due: float | None = None
    #: While Redis is down: the read slot this container's outage pacer reserved for this step
    #: (clock seconds). The step reads then without reserving again; once Redis answers it is void.
    paced_at: float | None = None
    #: The Sume key the job belongs to (:mod:`sume_poller.config.keys`); None: the default key (messages
    #: from before keys carry none).
    key: str | None = None
    #: Since when this job's per-job reads are refused with a status the contract does not name for
    #: them (a 4xx other than 401/403/404 on the job; a result refused after its status said
    #: completed): the refusal window's start (clock seconds). None once a read is answered. v3.
    refused_since: float | None = None
    #: The newest version this code reads; not part of the content (what is written: :meth:`wire_version`).
    v: int = field(default=VERSION, compare=False)

    def wire_version(self) -> int:
        """The lowest version that carries this message (v2 without any v3 field)."""
        return VERSION if any(getattr(self, name) is not None for name in V3_ONLY) else 2

    def to_json(self) -> str:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["v"] = self.wire_version()
        if self.outcome is not None:
            data["outcome"] = self.outcome.to_json()
        return json.dumps({k: v for k, v in data.items() if v is not None}, separators=(",", ":"), sort_keys=True)

    def next(self, **changes: Any) -> PollMessage:
        return replace(self, **changes)


_FIELDS = frozenset(f.name for f in fields(PollMessage))


def _integer(data: dict[str, Any], name: str, default: int | None = None, high: float = _MAX_COUNTER) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MessageError(f"{name} must be an integer")
    if not 0 <= value <= high:
        raise MessageError(f"{name} out of range")
    return value


def _time(data: dict[str, Any], name: str, required: bool = False) -> float | None:
    value = data.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MessageError(f"{name} must be a finite number")
    if not 0 <= value < _MAX_TIME:
        raise MessageError(f"{name} out of range")
    return float(value)


def parse_message(body: object) -> PollMessage:
    """Parse and validate an SQS body (v2 or v1); raise :class:`MessageError` with a clear reason."""
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
    version = data.get("v")
    if version not in (1, 2, VERSION) or isinstance(version, bool):
        raise MessageError(f"unsupported message version {version!r}")
    unknown = set(data) - (_V1_FIELDS if version == 1 else _FIELDS - V3_ONLY if version == 2 else _FIELDS)
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
        raise MessageError("token must be 32-64 lowercase hex characters")
    if token is None and (version != 1 or data.get("seq", 0) != 0):
        raise MessageError("a message without a token" if version != 1 else "seq without a token")
    profile = data.get("profile")
    if profile is not None and (not isinstance(profile, str) or not _PROFILE_RE.fullmatch(profile)):
        raise MessageError("profile must be 1-64 characters of A-Z a-z 0-9 _ | . : -")
    phase = data.get("phase", STATUS_PHASE)
    if phase not in (STATUS_PHASE, RESULT_PHASE, OUTBOX_PHASE):
        raise MessageError(f"phase must be {STATUS_PHASE}, {RESULT_PHASE} or {OUTBOX_PHASE}")
    outcome = Finding.parse(data.get("outcome"))
    if (phase == RESULT_PHASE) != (outcome is not None):
        raise MessageError("the result phase needs an outcome, and only it")
    key = data.get("key")
    if key is not None and not valid_key_id(key):
        raise MessageError("key must be 1-32 characters of A-Z a-z 0-9 _ - (starting with a letter or digit)")
    submitted = data.get("submitted_at")
    return PollMessage(
        job_id=job_id, kind=kind, deadline_at=_integer(data, "deadline_at", high=_MAX_TIME),
        due_at=_time(data, "due_at", required=True) or 0.0, token=token, seq=_integer(data, "seq", 0),
        submitted_at=None if submitted is None else _integer(data, "submitted_at", high=_MAX_TIME),
        profile=profile, reads=_integer(data, "reads" if version != 1 else "attempt", 0),
        result_reads=_integer(data, "result_reads", 0), errors=_integer(data, "errors", 0),
        seen_running_at=_time(data, "seen_running_at"), phase=phase, outcome=outcome,
        seen_terminal_at=_time(data, "seen_terminal_at"), result_waits=_integer(data, "result_waits", 0),
        slot_at=_time(data, "slot_at"), found_by=_found_by(data.get("found_by")),
        normal_due=_time(data, "normal_due"), paced_at=_time(data, "paced_at"), key=key,
        refused_since=_time(data, "refused_since"))


def _found_by(value: Any) -> str | None:
    if value is None or value in ("sweep", "webhook"):
        return value  # type: ignore[no-any-return]
    raise MessageError("found_by must be sweep or webhook")
