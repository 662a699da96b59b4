"""Where a chain's next read lands: the learned (or static) schedule, stretched where bulk
discovery covers the job's kind, and how far away a read slot a step will accept.

* :meth:`Cadence.next_read` - after a read that found the job running: the schedule's next read
  time (:func:`sume_poller.schedule.next_delay`, Sume's hint a lower bound), and, where sweeps
  proved they see the kind (or verified webhooks arrive for it), the safety cadence instead - the
  normal time kept in the message (``normal_due``) so the chain returns to it at once should the
  cover lapse (about one chain in twenty, a canary, is never stretched: it reads on the normal
  schedule, no more often than sweeps run); where many jobs are pending, stretched chains' reads
  and canaries' space out further, so that each group takes at most its share of the budget
  (``STRETCHED_SHARE``, ``CANARY_SHARE``);
* :meth:`Cadence.adjust` - a message as it comes back: a stretched step whose cover lapsed is
  due at its normal time; a chain's first read of a covered kind waits for the safety cadence too
  (hand-overs of sweeps and webhooks read at once);
* :meth:`Cadence.patience` - the farthest read slot a status read accepts under a binding budget
  (any, without a learned model; by the job's chance of being finished, with one; any again past
  the max-gap backstop); :meth:`Cadence.defer` - when to come back after refusing one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from .coverage import CANARY_EVERY, CoverageView, is_canary
from .messages import RESULT_PHASE, PollMessage
from .observability import logger
from .redisconn import RedisFailure, describe, failure
from .schedule import DEFAULT_W0, Bounds, defer_delay, max_wait, next_delay, overdue, read_priority
from .settings import PollSettings

#: Of the read budget, the most that stretched chains' reads together, and canaries' together, may
#: take: where pending jobs are many, each one's reads space out (past the safety cadence, past the
#: sweeps' interval) so that together they fit it - sweeps find the jobs, a miss they make is
#: measured by the canaries' finds and returns every chain of the kind to its normal schedule at once.
STRETCHED_SHARE = 0.1
CANARY_SHARE = 0.05


class Cadence:
    def __init__(self, settings: PollSettings, *, models: Callable[[str, str], Any] | None = None,
                 coverage: CoverageView | None = None, rate: float = math.inf,
                 rng: random.Random | None = None) -> None:
        self.s = settings
        self.models = models or (lambda profile, kind: None)
        #: What sweeps proved and whether webhooks arrive: covered kinds stretch to the safety cadence.
        self.coverage = coverage if settings.discovery.sweeps or settings.discovery.webhook_kinds else None
        self.bounds = Bounds(settings.schedule.min_interval, settings.schedule.max_interval,
                             settings.schedule.age_fraction)
        self.rate = rate  # reads per clock second the budget sustains (the backstop's scale)
        self.rng = rng or random.Random()
        #: Pending jobs as fan-out last counted them (the limiter passes it on).
        self.pending: int | None = None

    def adjust(self, msg: PollMessage, now: float) -> PollMessage:
        if msg.normal_due is not None and not self.stretches(msg.kind, msg.job_id, now):
            return msg.next(due_at=min(msg.due_at, msg.normal_due))  # no longer covered: the normal schedule
        if (msg.reads == 0 and msg.normal_due is None and msg.found_by is None and msg.phase != RESULT_PHASE
                and self.stretches(msg.kind, msg.job_id, now)):
            stretched = (msg.submitted_at or now) + self.stretched_gap(msg.kind, now)
            return msg.next(due_at=round(max(msg.due_at, stretched), 3), normal_due=round(msg.due_at, 3))
        return msg

    def next_read(self, chain: PollMessage, now: float, hint: float | None) -> tuple[float, float | None]:
        """(when the next read is due, its normal time when the chain is stretched, else None)."""
        model, age, last, _ = self._position(chain, now)
        due = now + next_delay(chain.kind, chain.reads - 1, age, last, model, self.bounds, hint=hint, rng=self.rng)
        if self.stretches(chain.kind, chain.job_id, now):
            return max(due, now + self.stretched_gap(chain.kind, now)), round(due, 3)
        return max(due, now + self._canary_gap(chain, now)), None

    def _spread(self, chains: float, share: float) -> float:
        """Clock seconds between reads of each of ``chains`` chains that together take ``share`` of
        the budget (0 where the budget or the pending count is not known)."""
        return 0.0 if self.pending is None or not 0 < self.rate < math.inf else chains / (self.rate * share)

    def stretched_gap(self, kind: str, now: float) -> float:
        """A stretched chain's reads: the safety cadence, or, where sweeps cover the kind, further
        apart where many are pending (webhooks alone: the safety cadence catches a lost delivery)."""
        d = self.s.discovery
        swept = self.coverage is not None and d.sweeps and self.coverage.get().stretches(kind, now)
        return max(d.safety, self._spread(self.pending or 0, STRETCHED_SHARE)) if swept else d.safety

    def _canary_gap(self, chain: PollMessage, now: float) -> float:
        """A canary of a kind sweeps cover reads no more often than sweeps run, nor than canaries
        together fit their share of the budget (0: not a canary, or not covered)."""
        if self.coverage is None or not self.s.discovery.sweeps or not is_canary(chain.job_id):
            return 0.0
        found = self.coverage.get()
        if not found.stretches(chain.kind, now):
            return 0.0
        return max(found.every, self._spread((self.pending or 0) / CANARY_EVERY, CANARY_SHARE))

    def found(self, chain: PollMessage, now: float, status: str | None = None) -> str | None:
        """A chain found its job terminal itself: kept for the next complete sweeps to judge (what
        proves or disproves their coverage). The Redis failure's kind when it could not be kept."""
        if self.coverage is None or not self.s.discovery.sweeps:
            return None
        try:
            self.coverage.store.found(chain.kind, chain.job_id, now, chain.submitted_at, status)
        except RedisFailure as exc:
            logger.warning("a chain's find was not kept for sweeps to judge", extra=describe(exc))
            return failure(exc)
        return None

    def stretches(self, kind: str, job_id: str, now: float) -> bool:
        if self.coverage is None or is_canary(job_id):
            return False
        found = self.coverage.get()
        d = self.s.discovery
        return (d.sweeps and found.stretches(kind, now)) or (
            kind in d.webhook_kinds and found.webhooks_arrive(now, within=2 * d.safety))

    def patience(self, chain: PollMessage, now: float) -> float:
        if chain.phase == RESULT_PHASE:
            return math.inf
        model, age, last, gap = self._position(chain, now)
        if model is None or (self.pending is not None and overdue(gap, self.pending, self.rate)):
            return math.inf
        return max_wait(read_priority(model, last, age), DEFAULT_W0)

    def defer(self, chain: PollMessage, now: float, slot_wait: float) -> float:
        """Seconds until a step that refused a slot ``slot_wait`` away comes back."""
        model, age, last, _ = self._position(chain, now)
        return defer_delay(model, last, age, slot_wait, DEFAULT_W0, self.bounds)

    def _position(self, chain: PollMessage, now: float) -> tuple[Any, float, float | None, float]:
        """(model or None, age, age at the last read that saw it running, seconds since that read)."""
        submitted = chain.submitted_at or chain.deadline_at - self.s.jobs.max_age
        model = self.models(chain.profile or chain.kind, chain.kind) if self.s.schedule.learned else None
        last = None if chain.seen_running_at is None else chain.seen_running_at - submitted
        gap = now - (chain.seen_running_at if chain.seen_running_at is not None else submitted)
        return model, max(0.0, now - submitted), last, gap
