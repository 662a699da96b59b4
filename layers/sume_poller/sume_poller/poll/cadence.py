"""Where a chain's next read lands: the learned (or static) schedule, stretched where bulk
discovery covers the job's kind, and how far away a read slot a step will accept.

* :meth:`Cadence.next_read` - after a read that found the job running: the schedule's next read
  time (:func:`sume_poller.schedule.planner.next_delay`, Sume's hint a lower bound), and, where sweeps
  proved they see the kind (or verified webhooks arrive for it), the safety cadence instead - the
  normal time kept in the message (``normal_due``) so the chain returns to it at once should the
  cover lapse (about one chain in twenty, a canary, is never stretched by sweeps: it reads on the
  normal schedule, no more often than sweeps run; so does a chain of a kind sweeps are still
  proving: healthy, never missed, no find judged yet); where many jobs are pending, stretched chains'
  reads and canaries' space out further, so that each group takes at most its share of the budget
  (``STRETCHED_SHARE``, ``CANARY_SHARE``); where verified webhooks arrive for the kind, its plan's
  late reads instead (:mod:`sume_poller.discovery.deliveries`: after the job is likely done and delivered,
  ``LOST_WITHIN`` apart; while the kind learns, from ``LOST_WITHIN`` past the youngest delivery seen,
  and ``LOST_WITHIN`` from submission until its first delivery came), the normal time kept the same way;
* :meth:`Cadence.adjust` - a message as it comes back: a stretched step whose cover lapsed is
  due at its normal time; a chain's first read of a covered kind waits for the safety cadence (or
  the late plan's first read) too (hand-overs of sweeps and webhooks read at once);
* :meth:`Cadence.probes` - does a late chain's read ask the result route (:mod:`sume_poller.discovery.deliveries`);
* :meth:`Cadence.patience` - the farthest read slot a status read accepts under a binding budget
  (any, without a learned model; by the job's chance of being finished, with one; any again past
  the max-gap backstop); :meth:`Cadence.defer` - when to come back after refusing one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.messages import RESULT_PHASE, STATUS_PHASE, PollMessage
from ..core.observability import logger
from ..discovery.coverage import CANARY_EVERY, CoverageView, is_canary
from ..discovery.deliveries import LOST_WITHIN, DeliveryStore, DeliveryView, LatePlan
from ..limits.redisconn import RedisFailure, describe, failure
from ..schedule.planner import DEFAULT_W0, Bounds, defer_delay, max_wait, next_delay, overdue, read_priority

if TYPE_CHECKING:  # poller.py imports this module
    from .poller import PollSettings

#: Of the read budget, the most that stretched chains' reads together, and canaries' together, may
#: take: where pending jobs are many, each one's reads space out (past the safety cadence, past the
#: sweeps' interval) so that together they fit it - sweeps find the jobs, a miss they make is
#: measured by the canaries' finds and returns every chain of the kind to its normal schedule at once.
STRETCHED_SHARE = 0.1
CANARY_SHARE = 0.05


class Cadence:
    def __init__(self, settings: PollSettings, *, models: Callable[[str, str], Any] | None = None,
                 coverage: CoverageView | None = None, rate: float = math.inf,
                 rng: random.Random | None = None, deliveries: DeliveryView | None = None) -> None:
        self.s = settings
        self.models = models or (lambda profile, kind: None)
        #: What sweeps proved and whether webhooks arrive: covered kinds stretch to the safety cadence.
        self.coverage = coverage if settings.discovery.sweeps or settings.discovery.webhook_kinds else None
        #: Where deliveries arrive: each webhook kind's late plan (the coverage's Redis by default).
        client = getattr(getattr(coverage, "store", None), "client", None)
        if deliveries is None and coverage is not None and client is not None:
            deliveries = DeliveryView(DeliveryStore(client, coverage.store.prefix), coverage.now)
        self.deliveries = deliveries if settings.discovery.webhook_kinds else None
        self.bounds = Bounds(settings.schedule.min_interval, settings.schedule.max_interval,
                             settings.schedule.age_fraction)
        self.rate = rate  # reads per clock second the budget sustains (the backstop's scale)
        self.rng = rng or random.Random()
        #: Pending jobs as fan-out last counted them (the limiter passes it on).
        self.pending: int | None = None

    def adjust(self, msg: PollMessage, now: float) -> PollMessage:
        stretched, late = self.stretches(msg.kind, msg.job_id, now), self.late(msg.kind, now)
        if msg.normal_due is not None and not stretched and late is None:
            return msg.next(due_at=min(msg.due_at, msg.normal_due))  # no longer covered: the normal schedule
        if (msg.reads == msg.result_reads == 0 and msg.normal_due is None and msg.found_by is None
                and msg.phase != RESULT_PHASE and (stretched or late is not None)):
            gap = late.first if late is not None and not stretched else self.stretched_gap(msg.kind, now)
            first = (msg.submitted_at or now) + gap
            return msg.next(due_at=round(max(msg.due_at, first), 3), normal_due=round(msg.due_at, 3))
        return msg

    def next_read(self, chain: PollMessage, now: float, hint: float | None) -> tuple[float, float | None]:
        """(when the next read is due, its normal time when the chain is stretched, else None)."""
        model, age, last, _ = self._position(chain, now)
        due = now + next_delay(chain.kind, max(0, chain.reads - 1), age, last, model, self.bounds, hint=hint,
                               rng=self.rng)
        if self.stretches(chain.kind, chain.job_id, now):
            return max(due, now + self.stretched_gap(chain.kind, now)), round(due, 3)
        if (late := self.late(chain.kind, now)) is not None:  # after the job is likely done and delivered
            at = (chain.submitted_at or now - age) + late.next_age(age)
            return max(min(at, now + self.bounds.max_interval), now + self.bounds.min_interval, now + (hint or 0.0)), \
                round(due, 3)
        return max(due, now + self._canary_gap(chain, now)), None

    def late_read(self, chain: PollMessage, now: float) -> dict[str, Any]:
        """A late chain's probe found no result: its next read (``due``, ``normal_due``)."""
        due, normal = self.next_read(chain, now, None)
        return {"due": due, "normal_due": normal}

    def late(self, kind: str, now: float) -> LatePlan | None:
        """The kind's late plan, where verified deliveries arrive for it (None: no webhooks, none lately,
        or none yet for this kind: a kind with a few has a learning plan)."""
        return self.deliveries.get(kind) if self.deliveries is not None and self._arriving(kind, now) else None

    def _spread(self, chains: float, share: float) -> float:
        """Clock seconds between reads of each of ``chains`` chains that together take ``share`` of
        the budget (0 where the budget or the pending count is not known)."""
        return 0.0 if self.pending is None or not 0 < self.rate < math.inf else chains / (self.rate * share)

    def stretched_gap(self, kind: str, now: float) -> float:
        """How far a stretched chain's reads are apart: where sweeps cover the kind, the safety cadence,
        further apart where many are pending; ``LOST_WITHIN`` while deliveries arrive but none yet for
        the kind to plan on (a lost one found as soon)."""
        d = self.s.discovery
        swept = self.coverage is not None and d.sweeps and self.coverage.get().stretches(kind, now)
        return max(d.safety, self._spread(self.pending or 0, STRETCHED_SHARE)) if swept else min(LOST_WITHIN, d.safety)

    def _canary_gap(self, chain: PollMessage, now: float) -> float:
        """A canary of a kind sweeps cover reads no more often than sweeps run, nor than canaries
        together fit their share of the budget; a chain of a kind sweeps are still proving (healthy,
        never missed one of its finds, none judged yet) no more often than sweeps run, at most the
        safety cadence apart: a find is judged by the next complete sweep, and a job finished sooner
        is listed by it (0: neither)."""
        if self.coverage is None or not self.s.discovery.sweeps:
            return 0.0
        found = self.coverage.get()
        if found.proving(chain.kind, now):  # idle sweeps back off: never further apart than the safety cadence
            return min(found.every, self.s.discovery.safety)
        if not is_canary(chain.job_id) or not found.stretches(chain.kind, now):
            return 0.0
        return max(found.every, self._spread((self.pending or 0) / CANARY_EVERY, CANARY_SHARE))

    def _arriving(self, kind: str, now: float) -> bool:
        """Verified deliveries arrive (lately) for a kind that has webhooks."""
        return (self.coverage is not None and kind in self.s.discovery.webhook_kinds
                and self.coverage.get().webhooks_arrive(now, within=2 * self.s.discovery.safety))

    def probes(self, chain: PollMessage, now: float) -> bool:
        """Does this read ask the result route? A late chain's, before its plan's tail, while its
        reads met no fault (one did: a status read decides) and the job was handed over to none."""
        if chain.phase != STATUS_PHASE or chain.errors or chain.found_by is not None or chain.outcome is not None:
            return False
        late = None if self.stretches(chain.kind, chain.job_id, now) else self.late(chain.kind, now)
        return late is not None and late.probes(self._position(chain, now)[1])

    def found(self, chain: PollMessage, now: float, status: str | None = None) -> str | None:
        """A chain found its job terminal itself: kept for the next complete sweeps to judge (what
        proves or disproves their coverage), and, for a webhook kind, as a delivery lost (or late). The
        Redis failure's kind when it could not be kept."""
        if self.coverage is None:
            return None
        try:
            if self.deliveries is not None and chain.kind in self.s.discovery.webhook_kinds:
                self.deliveries.store.found(chain.kind)
            if self.s.discovery.sweeps:
                self.coverage.store.found(chain.kind, chain.job_id, now, chain.submitted_at, status)
        except RedisFailure as exc:
            logger.warning("a chain's find was not kept for sweeps to judge", extra=describe(exc))
            return failure(exc)
        return None

    def stretches(self, kind: str, job_id: str, now: float) -> bool:
        """To the safety cadence: sweeps proved they see the kind (canaries excepted: they measure that),
        or deliveries arrive but none yet for this kind to plan late reads on (:meth:`late`)."""
        if self.coverage is None:
            return False
        if self.s.discovery.sweeps and not is_canary(job_id) and self.coverage.get().stretches(kind, now):
            return True
        return self._arriving(kind, now) and (self.deliveries is None or self.deliveries.get(kind) is None)

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
