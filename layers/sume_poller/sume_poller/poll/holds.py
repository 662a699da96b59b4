"""What keeps other pollers off a job while one step of its chain acts: a :class:`Hold`.

* :class:`LeaseHold` - the job's Redis lease (:mod:`sume_poller.limits.lease`), claimed by this step;
* :class:`FenceHold` - while Redis is unreachable: the fence on the job record
  (:meth:`sume_poller.store.records.JobStore.fence`), which keeps the chain's next due time so fan-out
  does not start a second chain once Redis is back;
* :class:`NoHold` - nothing to hold (fan-out's outbox message touches no lease).

Each is told when the chain's next step is due (:meth:`Hold.rest`), when the job is finished
(:meth:`Hold.release`), and when the next step could not be sent after all (:meth:`Hold.undo_rest`:
the lease goes, so SQS's redelivery of this step can take over). None raises on a Redis failure:
a lease that was not rested or released expires by itself.
"""

from __future__ import annotations

from typing import Protocol

from ..core.messages import RESULT_PHASE, PollMessage
from ..core.observability import logger
from ..limits.lease import ChainStep, LeaseStore, resting_value
from ..limits.redisconn import RedisFailure, describe
from ..store.records import JobStore


class Hold(Protocol):
    def rest(self, nxt: PollMessage, due: float, ttl_real: float) -> bool: ...
    def release(self) -> None: ...
    def undo_rest(self) -> None: ...


class LeaseHold:
    """The job's Redis lease, held by one step of a chain."""

    def __init__(self, lease: LeaseStore, job_id: str, step: ChainStep) -> None:
        self.lease, self.job_id, self.step = lease, job_id, step
        self._rested = step.next_resting

    def rest(self, nxt: PollMessage, due: float, ttl_real: float) -> bool:
        # A step that fetches the result of a job Sume finished rests as a finishing step ("*"):
        # no sweep or webhook hands it over again, so it keeps its reserved read slot. A status
        # step that reserved a slot says so in the lease: a hand-over passes the slot on.
        finishing = nxt.phase == RESULT_PHASE
        self._rested = resting_value(self.step, finishing, nxt.slot_at)
        try:
            return self.lease.rest(self.job_id, self.step, max(1, int(ttl_real * 1000)), finishing=finishing,
                                   slot=nxt.slot_at)
        except RedisFailure as exc:  # keep the chain going: its next message re-takes the lease
            logger.warning("lease rest failed (Redis); re-queueing anyway", extra=describe(exc))
            return True

    def release(self) -> None:
        self._release(self.step.claimed)

    def undo_rest(self) -> None:
        self._release(self._rested)

    def _release(self, value: str) -> None:
        try:
            self.lease.release(self.job_id, value)
        except RedisFailure as exc:  # it expires on its own
            logger.warning("lease release failed; it will expire", extra=describe(exc))


class FenceHold:
    """While Redis is down: the fence on the job record keeps the chain's next due time (plus a
    margin), so fan-out leaves the job to this chain once Redis is back."""

    def __init__(self, store: JobStore, job_id: str, margin: float) -> None:
        self.store, self.job_id, self.margin = store, job_id, margin

    def rest(self, nxt: PollMessage, due: float, ttl_real: float) -> bool:
        self.store.set_chain_due(self.job_id, max(due, nxt.paced_at or 0.0) + self.margin)
        return True

    def release(self) -> None:
        pass

    def undo_rest(self) -> None:
        pass


class NoHold:
    """Nothing to hold: an outbox message touches no lease."""

    def rest(self, nxt: PollMessage, due: float, ttl_real: float) -> bool:
        return True

    def release(self) -> None:
        pass

    def undo_rest(self) -> None:
        pass
