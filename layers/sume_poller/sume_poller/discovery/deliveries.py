"""Where verified webhook deliveries arrive for a kind, its chains read late: after the job is
likely done and its delivery likely in, so a delivered job's chain finds it recorded (no read) and
a job whose delivery was lost is read soon after it finished.

What is learned, per kind, in Redis (two bounded lists a kind, newest first):

* ``ages``: a job's age when its verified delivery arrived (the webhook receiver) - Sume's own
  time to completion plus its delivery's lag, the last ``SAMPLE``;
* ``finds``: ``d`` for a delivery, ``f`` for a job its chain found finished itself (a delivery
  lost, or later than the chain), the last ``FINDS``: the share of ``f`` is the loss planned for.

The plan (:func:`plans`, pure): a chain's first read at an age ``first`` chosen per kind, then
every ``LOST_WITHIN`` seconds (the gap that finds a lost one within that time) up to the sample's
largest age, ``tail``; past it, reads space out geometrically (half the age). Each kind's
``first`` minimises the reads made before completion (what every job pays, delivered or not)
plus the share of jobs a lost delivery would leave unfound for longer than ``LOST_WITHIN``,
priced by one multiplier for all kinds: the smallest that keeps those late jobs, over every
kind by its deliveries and times the loss, within ``LOST_LATE_SHARE`` of all jobs (the p95). A read up
to ``tail`` (and half a gap past it) asks the result route (:meth:`LatePlan.probes`): a result is
Sume's word that the job completed (one read for a lost delivery, not a status read and a result
read); any other answer leaves the job to its next read. Past that (a failed job whose delivery
was lost answers the result route as a running one does) the reads are status reads.

Below ``MIN_SAMPLE`` ages a kind's plan is a learning one (``learning``): too few ages to price a
first read on, so its first read comes ``LOST_WITHIN`` after the youngest age a delivery came at
(a lost job that finished at that age or later is read within ``LOST_WITHIN`` of finishing; a
kind's first deliveries come from its fastest jobs, so that age is low), then every ``LOST_WITHIN``
for as long as the job runs; reads up to the oldest age seen so far (and half a gap past it) ask the
result route, the later ones the status. A kind with no delivery age yet has no plan: while
deliveries arrive, its chains read every ``LOST_WITHIN`` seconds (status reads;
:mod:`sume_poller.poll.cadence`). Containers read the lists through :class:`DeliveryView`, cached
for ``DELIVERY_VIEW_TTL`` clock seconds.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..core.jobs import KINDS
from ..core.values import value
from ..limits.redisconn import RedisFailure

SAMPLE = 200
FINDS = 500
MIN_SAMPLE = 20
#: A lost delivery's job is read within this many clock seconds of finishing (but the late share)...
LOST_WITHIN = 300.0
#: ... for all but this share of all jobs, delivered or not.
LOST_LATE_SHARE = 0.035
#: The loss planned for at least (a loss never seen yet is not none).
MIN_LOSS = 0.1
DELIVERY_VIEW_TTL = 60.0
_KEEP_MS = 7 * 86_400_000


@value
class LatePlan:
    """A webhook kind's plan for a chain whose delivery may be lost: when it reads first and after."""

    first: float  # the age of a chain's first read
    tail: float  # the largest age a delivery came at: reads past it are status reads, spaced out
    gap: float = LOST_WITHIN
    #: Too few ages to plan on (below ``MIN_SAMPLE``): past the tail, reads stay a gap apart.
    learning: bool = False

    def next_age(self, age: float) -> float:
        """The age of the read after one at ``age`` (or of the first, before it)."""
        if age < self.first:
            return self.first
        if age < self.tail or self.learning:
            return self.first + (math.floor((age - self.first) / self.gap + 1e-6) + 1) * self.gap
        return age + max(self.gap, age / 2)

    def probes(self, age: float) -> bool:
        """Does a read at ``age`` ask the result route (a result: the job completed)? Up to the tail,
        and half a gap past it: a read planned at the tail arrives a little after it."""
        return age <= self.tail + self.gap / 2


@value
class _Choice:
    """A candidate first read, scored by the reads it costs and the lost deliveries it leaves late."""

    first: float
    reads: float  # reads made before completion, a job on average
    late: float  # share of jobs a lost delivery leaves unfound past ``gap``
    delay: float  # a lost one's mean wait ÷ gap (breaks ties toward earlier reads)


def _choices(ages: list[float], gap: float) -> list[_Choice]:
    """Each candidate first read (each age of the sample, and each plus ``gap``) and its cost."""
    n = len(ages)
    at = sorted({a + extra for a in ages for extra in (0.0, gap)})
    out = []
    for first in at:
        reads = late = delay = 0.0
        for a in ages:
            k = 0 if a <= first else math.ceil((a - first) / gap)
            reads += k
            late += a < first - gap
            delay += first + k * gap - a
        out.append(_Choice(first, reads / n, late / n, delay / n / gap))
    return out


def plans(samples: dict[str, list[float]], weights: dict[str, float], loss: float,
          gap: float = LOST_WITHIN, share: float = LOST_LATE_SHARE) -> dict[str, LatePlan]:
    """Each kind's plan from its delivery ages (kinds with fewer than ``MIN_SAMPLE``: a learning
    plan, a gap after the youngest age; with none: no plan)."""
    ages = {k: sorted(v) for k, v in samples.items() if len(v) >= MIN_SAMPLE}
    learning = {k: LatePlan(min(v) + gap, max(v), gap, learning=True)
                for k, v in samples.items() if 0 < len(v) < MIN_SAMPLE}
    choices = {k: _choices(v, gap) for k, v in ages.items()}
    total = sum(weights.get(k, 1.0) for k in ages) or 1.0
    allowed = share / max(loss, MIN_LOSS)

    def pick(price: float) -> dict[str, _Choice]:
        return {k: min(c, key=lambda x: x.reads + price * x.late + 0.1 * x.delay) for k, c in choices.items()}

    def late(picked: dict[str, _Choice]) -> float:
        return sum(weights.get(k, 1.0) * c.late for k, c in picked.items()) / total

    lo, hi = 0.0, 1_000.0
    if late(pick(lo)) > allowed:
        for _ in range(30):  # the smallest price that keeps the late share allowed
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if late(pick(mid)) <= allowed else (mid, hi)
        lo = hi
    return {**learning, **{k: LatePlan(c.first, ages[k][-1], gap) for k, c in pick(lo).items()}}


class DeliveryStore:
    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = f"{prefix}!webhooks:"

    def _push(self, pipe: Any, key: str, value: Any, keep: int) -> None:
        pipe.lpush(key, value)
        pipe.ltrim(key, 0, keep - 1)
        pipe.pexpire(key, _KEEP_MS)

    def delivered(self, kind: str, age: float) -> None:
        """A verified delivery arrived for a job of ``kind`` this old (clock seconds)."""
        pipe = self.client.pipeline(transaction=False)
        self._push(pipe, f"{self.prefix}ages:{kind}", round(age, 1), SAMPLE)
        self._push(pipe, f"{self.prefix}finds:{kind}", "d", FINDS)
        pipe.execute()

    def found(self, kind: str) -> None:
        """A chain found a job of ``kind`` finished itself (its delivery lost, or late)."""
        pipe = self.client.pipeline(transaction=False)
        self._push(pipe, f"{self.prefix}finds:{kind}", "f", FINDS)
        pipe.execute()

    def plans(self, kinds: Iterable[str] = KINDS) -> dict[str, LatePlan]:
        kinds = sorted(kinds)
        pipe = self.client.pipeline(transaction=False)
        for kind in kinds:
            pipe.lrange(f"{self.prefix}ages:{kind}", 0, -1)
            pipe.lrange(f"{self.prefix}finds:{kind}", 0, -1)
        got = pipe.execute()
        samples = {k: [float(a) for a in got[2 * i]] for i, k in enumerate(kinds)}
        finds = [f for i in range(len(kinds)) for f in got[2 * i + 1]]
        weights = {k: float(sum(1 for f in got[2 * i + 1] if f == "d") or 1) for i, k in enumerate(kinds)}
        loss = sum(1 for f in finds if f == "f") / len(finds) if finds else 1.0
        return plans(samples, weights, loss)


class DeliveryView:
    """Per-container cache of :meth:`DeliveryStore.plans` (Redis down: no plan, the normal schedule)."""

    def __init__(self, store: DeliveryStore, now: Callable[[], float], ttl: float = DELIVERY_VIEW_TTL) -> None:
        self.store = store
        self.now = now
        self.ttl = ttl
        self._plans: dict[str, LatePlan] = {}
        self._at = -math.inf
        self._lock = threading.Lock()

    def get(self, kind: str) -> LatePlan | None:
        now = self.now()
        with self._lock:
            if now - self._at >= self.ttl:
                try:
                    self._plans = self.store.plans()
                except RedisFailure:
                    self._plans = {}
                self._at = now
            return self._plans.get(kind)
