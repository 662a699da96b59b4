"""One poll step's working parts: what it decides before the gate (:func:`plan`, pure), the real
time it may take (:class:`Deadline`), what it carries while it runs (:class:`Run`: the chain so far,
the hold, the reads it made and the signals to count) and what it hands back (:class:`Outcome`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import field
from typing import Any

from ..core.clock import Clock
from ..core.messages import RESULT_PHASE, Finding, PollMessage
from ..core.values import value
from ..limits.budget import Mode
from ..store.queue import Outgoing
from .holds import Hold

#: A message this close to its due time (clock seconds) is read now rather than hopped again.
HOP_TOLERANCE = 0.1
#: Real seconds a Sume call needs at least, and the time kept after it for the steps that
#: follow (lease, terminal write, event): a record with less left does not start a read.
MIN_READ_REAL = 1.0
AFTER_READ_REAL = 3.0
#: While Redis is down, a step waiting for its outage-pacer slot comes back at least this often
#: (clock seconds): once Redis answers again it reads at its own due time, not the pacer's.
PACED_HOP = 30.0
#: At its deadline a job gets one last read (clock seconds): the step accepts a read slot at most
#: this far past the deadline (a binding budget's line), else it is recorded timed_out without it.
LAST_READ_WAIT = 300.0


@value
class StepPlan:
    """What a step asks of the gate."""

    #: Clock seconds until the message is due (it only hops, reading nothing); None: due now.
    hop: float | None
    #: The lease's TTL for this claim (real ms): until the hop's next delivery plus the margin, or
    #: the claim TTL of a step that reads.
    ttl_ms: int
    #: The read slot asked for: NONE (a hop), CONFIRM/RCONFIRM (the slot the step reserved
    #: earlier, for a status or a result read), AHEAD (a job known to be finished: its result,
    #: or the status read that confirms a list's or webhook's word) or TAKE (a status read).
    mode: Mode
    #: The farthest slot accepted (clock seconds; inf: any).
    patience: float


def plan(msg: PollMessage, now: float, *, clock: Clock, max_delay: float, margin_real: float, claim_ttl_real: float,
         patience: Callable[[PollMessage, float], float]) -> StepPlan:
    """What step ``msg`` asks of the gate at clock time ``now``. At or past the job's deadline a step
    reads once more: it accepts a slot at most ``LAST_READ_WAIT`` past the deadline."""
    due = min(msg.due_at, float(msg.deadline_at))
    hop = due - now if due - now > HOP_TOLERANCE else None
    ttl = clock.to_real(min(hop, max_delay)) + margin_real if hop else float(claim_ttl_real)
    if hop or (msg.phase == RESULT_PHASE and msg.outcome is not None and msg.outcome.next_read() is None):
        mode = Mode.NONE  # a hop reads nothing; nor does recording a failure a signed webhook stated
    elif msg.slot_at is not None:
        mode = Mode.RCONFIRM if msg.phase == RESULT_PHASE else Mode.CONFIRM
    else:
        mode = Mode.AHEAD if msg.phase == RESULT_PHASE or msg.found_by == "sweep" else Mode.TAKE
    wait = patience(msg, now) if mode is Mode.TAKE else math.inf
    if now >= msg.deadline_at and mode in (Mode.TAKE, Mode.AHEAD):
        wait = min(wait, max(0.0, msg.deadline_at + LAST_READ_WAIT - now))
    return StepPlan(hop, max(1, int(ttl * 1000)), mode, wait)


class Deadline:
    """The real time one record's work may take (the invocation's, less a safety margin)."""

    def __init__(self, seconds: float, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._end = now() + seconds

    def left(self) -> float:
        return self._end - self._now()

    def call_left(self) -> float:
        """Real seconds a Sume call (a result streaming in, say) may still take, leaving what follows it its time."""
        return self.left() - AFTER_READ_REAL

    def call_timeout(self) -> float:
        """The timeout of a Sume call starting now: :meth:`call_left`, at least 50 ms."""
        return max(0.05, self.call_left())

    def fits_a_read(self) -> bool:
        """Whether a Sume read still fits: its shortest call and what follows it."""
        return self.left() >= MIN_READ_REAL + AFTER_READ_REAL

    def wait_room(self) -> float:
        """Real seconds a wait may take and still leave a read its time."""
        return self.left() - MIN_READ_REAL - AFTER_READ_REAL


@value
class Outcome:
    """What one message did. ``send`` is the chain's next message, for the batch to send;
    ``undo`` frees the lease if that send fails (so SQS's redelivery can take over)."""

    name: str
    status_reads: int = 0
    result_reads: int = 0
    status: str | None = None
    send: Outgoing | None = None
    undo: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    failed: bool = False
    signals: tuple[str, ...] = ()
    #: The Sume key of the message's job (set by the batch adapter, for per-key metrics).
    key: str | None = None

    @property
    def reads(self) -> int:
        return self.status_reads + self.result_reads


@value(frozen=False, slots=False)
class Run:
    """One step as it runs: the chain so far (updated as Sume answers), what holds the job, the
    invocation's deadline, and the tally the outcome reports."""

    chain: PollMessage
    hold: Hold
    deadline: Deadline
    status_reads: int = 0
    result_reads: int = 0
    signals: list[str] = field(default_factory=list)
    #: The job's deadline has passed: this step's read is its last (whatever would re-queue it records
    #: ``timed_out`` instead), and the status that read found.
    final: bool = False
    last_status: str | None = None
    #: What the chain knew of the job's end when this step set it aside to read the status (Sume's
    #: gate: the wait reads the status): a refusal or the deadline then records what Sume had said.
    said: Finding | None = None

    def read_status(self) -> None:
        self.status_reads += 1
        self.chain = self.chain.next(reads=self.chain.reads + 1, slot_at=None)

    def read_result(self) -> None:
        self.result_reads += 1
        self.chain = self.chain.next(result_reads=self.chain.result_reads + 1, slot_at=None)

    def signal(self, name: str) -> None:
        self.signals.append(name)

    def refresh(self, record: dict[str, Any]) -> None:
        """A chain that (re)starts takes the job's facts from its record."""
        submitted = record.get("submitted_at")
        self.chain = self.chain.next(
            kind=str(record.get("kind") or self.chain.kind),
            deadline_at=int(record.get("deadline_at") or self.chain.deadline_at),
            submitted_at=int(submitted) if isinstance(submitted, int | float) else self.chain.submitted_at,
            profile=record.get("profile") or self.chain.profile)

    def outcome(self, name: str, **fields: Any) -> Outcome:
        return Outcome(name, self.status_reads, self.result_reads, signals=tuple(self.signals), **fields)
