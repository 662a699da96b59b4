"""Where the next status read lands. Pure functions, standard library only (this runs in Lambda).

Sume sends no usable poll hint, and every status read spends a small daily budget.
:func:`next_delay` is the entry point; two schedules behind it:

* **static** (:func:`static_delay`): fixed intervals per kind (images and other short kinds 2, 3,
  5, 8, 13, 20, 30 s; video and ad_video 10, 15, 20, 30, 45, 60 s; the last repeats; +/-20 %
  jitter). Used while a kind (or profile) has fewer than
  :data:`~sume_poller.schedule.durations.MIN_OBSERVATIONS` completed observations (model None).
* **learned** (:func:`learned_plan`): from the fitted log-normal completion time T, read ages
  chosen by dynamic programming on a log-spaced age grid (about 5 % apart, from the model's
  1e-4 quantile to its 1 - 1e-6 one) minimising, per job,

      E[reads] + lam_delay * E[detection delay] + lam_late * P(delay > x * T)

  with ``x`` the static schedule's 95th percentile of delay/T on the same model, plus
  ``lam_late * P'(delay > 1.05 x T)`` on the model moved earlier by twice the error its fit
  states (:func:`late_model`). The two multipliers are searched (a ladder in lam_late, refined
  around the best rung, bisection in lam_delay) for the plan with the fewest reads whose mean
  delay is at most 0.95 x the static schedule's and whose share of late jobs is at most 5 % by
  both counts: each kind (or profile) meets static's figures on its own model, and still within
  5 % if the model is off by as much as its fit may be (see DELAY_MARGIN). The grid step
  divides log(1 + x), so reads exactly 1 + x apart (never late) are on it. Built once per
  (model, short/long schedule, bounds) and cached (10-50 ms); a plan that cannot beat the
  static schedule on its own model is not used (the static schedule is). Between reads, the
  next one comes from one step of the DP from the job's actual state (its last running age and
  its age now), so a late read, a deferral or jitter does not throw the plan off; past the grid
  (a job older than the model expected) reads continue geometrically within the bounds.

Both go through :class:`Bounds`: minimum and maximum interval, and at most ``age_fraction``
times ``max(age, expected)`` where ``expected`` is the model's 90th percentile (twice the static
schedule's span without a model): a late job is still found within a fraction of its age. The
cap does not apply from age 0: it would force reads at 2, 3, 4.5, ... s on every video (bench
figure 7: +43 % reads over static). Sume's ``next_poll_after_seconds`` is a lower bound on top.

Under a binding read budget the shared limiter grants slots FIFO by reservation time. A job asks
with ``max_wait(read_priority(...))`` (the odds that a read now finds it finished, times w0), so
the queue's wait W admits exactly the jobs with P(finished) >= W / (W + w0); a refusal comes
back after :func:`defer_delay` (when it would accept what is left of the wait), and
:func:`overdue` is the backstop against starvation.
"""
from __future__ import annotations

import bisect
import functools
import math
import random
import re
from collections.abc import Mapping, Sequence

from ..core.jobs import LONG_KINDS, jittered
from ..core.values import value
from .durations import LogNormal

#: Static schedules (seconds between reads, indexed by attempt; the last value repeats).
SHORT_SCHEDULE: tuple[float, ...] = (2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0)
LONG_SCHEDULE: tuple[float, ...] = (10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
STATIC_JITTER = 0.2
#: The learned schedule's jitter: small (it is optimised), enough to spread a batch's reads.
LEARNED_JITTER = 0.05
#: The learned plan's targets, per model (a kind, or a profile: each against its own static
#: schedule on its own model, never pooled): mean delay at most DELAY_MARGIN x static's, and at
#: most LATE_SHARE of jobs found later than x = static's 95th percentile of delay/duration - on
#: the fitted model, and later than LATE_ALLOWANCE x x on the late model, the fitted one moved
#: earlier by LATE_SE standard errors of its LATE_TAIL quantile (:func:`late_model`; the error
#: the fit states, ``LogNormal.cov``, capped at LATE_SHIFT_MAX in log seconds).
#:
#: Why the fit's error and not a margin on x: a plan saves its reads by skipping the earliest few
#: per cent of jobs (a video's first read near 0.45 of its median), and those are found at
#: 1.5-3x their duration, far past x. Its tail of delay/duration is flat there (on the true video
#: model 4.3 % of jobs past x, 4.2 % past 1.05 x; static's 5 % and 4.3 %), so its 95th
#: percentile sits on a cliff: a lower tail a point or two heavier than the model says moves it
#: from below x to 1.5-2x, and a fit of ~70 observations misplaces its 5 % quantile by one
#: standard error (11 % in time for a video) one time in three. (Bench figure 7's seed 7: video's
#: by 2.0, its p95 1.89x static's; the pooled one, images' mostly, looked fine.) A job found a
#: little past x (a read 1 + x or so after the last) barely moves the percentile: the late model
#: counts only those past the 5 % the per-kind target allows.
#:
#: Chosen on bench figure 7's workload over 80 seeds (``python -m bench.fig_schedule --quick
#: --seeds 80``): per kind (image, video, ad video) p95 of delay/duration above 1.05x static's in
#: 1, 3 and 4 seeds (LATE_SE = 0 with the former margins: 4, 24, 25; the offline optimum, which
#: knows the true distribution but has no margin: 1, 17, 33), mean delay in 0, 2, 1 (0, 1, 1);
#: both met for every kind in 70 seeds (35). The price is reads: 1.14, 1.14, 1.11x the optimum's
#: on average (1.08, 1.10, 1.10), more than 1.15x in 34, 29, 19 seeds (12, 13, 16); pooled 0.65
#: of static's (0.64). LATE_SE = 1.75 keeps 1.2 % of the reads (above 1.15x in 25, 21, 10 seeds)
#: and misses p95 in 1, 5, 4 seeds, bench seed 7's video among them (1.20; 1.5: 1.21). The shift
#: is proportional to the fit's error, so to 1 / sqrt(observations).
DELAY_MARGIN = 0.95
LATE_SHARE = 0.05
LATE_SE = 2.0
LATE_TAIL = 0.05
LATE_ALLOWANCE = 1.05
LATE_SHIFT_MAX = 0.5
#: The quantile of the model past which a job is "late": the age cap applies from there on.
LATE_QUANTILE = 0.9
#: The slot-wait scale of :func:`max_wait` (seconds) and the max-gap backstop's factor (bench
#: figure 7: mean delay under a binding budget moves < 3 % over w0 10-300 s and factors 0.5-1.5;
#: these two keep refused slots, each a message and an invocation, to ~5 per job).
DEFAULT_W0 = 30.0
DEFAULT_OVERDUE_FACTOR = 0.5

# The DP grid: log-spaced from the model's 1e-4 quantile to its 1 - 1e-6 quantile, about 5 %
# apart; a read is at most WINDOW times the previous one's age (or one grid step).
_GRID_STEP = 1.05
_GRID_MIN, _GRID_MAX = 24, 112
_P_LO, _S_HI = 1e-4, 1e-6
_WINDOW = 4.0
_SEARCH_STEPS = 9
#: log2 lam_late rungs; the first (below _L2_MIN) is lam_late = 0.
_L2_MIN = -6.0
_LATE_LADDER = (-99.0, *range(-4, 15, 2))
#: Half-widths (log2) of the rungs tried around the best lam_late after the ladder.
_REFINE = (1.0, 0.5, 0.25)


# -- static ---------------------------------------------------------------------------------------

def static_schedule(kind: str | None) -> tuple[float, ...]:
    """The static intervals of a kind: long for video and ad_video, short for everything else."""
    return LONG_SCHEDULE if kind in LONG_KINDS else SHORT_SCHEDULE


def static_delay(kind: str | None, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds until read number ``attempt`` (0: the first after submission) on the static
    schedule: indexed by attempt, the last value repeats, +/-20 % jitter, at least 1 s."""
    schedule = static_schedule(kind)
    base = schedule[min(max(attempt, 0), len(schedule) - 1)]
    return max(1.0, jittered(base, STATIC_JITTER, rng))


def static_read_ages(kind: str | None, until: float, limit: int = 100_000) -> list[float]:
    """The static schedule's read ages without jitter, up to the first at or past ``until``."""
    schedule = static_schedule(kind)
    ages: list[float] = []
    t = 0.0
    while t < until and len(ages) < limit:
        t += schedule[min(len(ages), len(schedule) - 1)]
        ages.append(t)
    return ages


def _static_expected(kind: str | None) -> float:
    """The age past which the static schedule (no model) treats a job as late: twice its
    whole span (162 s short, 360 s long), so that at the production cap (0.5) the cap never
    shortens its own jittered intervals."""
    return 2.0 * sum(static_schedule(kind))


# -- bounds ---------------------------------------------------------------------------------------

@value
class Bounds:
    """Limits on the interval between reads (seconds).

    ``limit`` keeps a delay within ``[min_interval, max_interval]`` and at most ``age_fraction``
    times ``max(age, expected)``, where ``expected`` is the age past which a job is late (the
    model's 90th percentile; twice the static schedule's span when there is no model).
    ``min_interval`` wins over both caps. A cap on ``age_fraction * age`` from age 0 would force reads at 2, 3,
    4.5, ... s on every video (see bench figure 7): the cap is the late-job guarantee.
    """

    min_interval: float = 2.0
    max_interval: float = 1_800.0
    age_fraction: float = 0.5

    def cap(self, age: float, expected: float = 0.0) -> float:
        """The longest interval allowed at ``age`` (before ``min_interval`` wins)."""
        return min(self.max_interval, self.age_fraction * max(age, expected, 0.0))

    def limit(self, delay: float, age: float, expected: float = 0.0) -> float:
        """``delay`` within the bounds at ``age``."""
        return max(self.min_interval, min(delay, self.cap(age, expected)))


# -- expected costs of a read-age sequence ----------------------------------------------------------

@value
class Metrics:
    """What a read schedule costs on a model: expected reads, mean detection delay (s), and the
    share of jobs found later than ``late_ratio`` times their duration."""

    reads: float
    mean_delay: float
    late: float
    late_ratio: float


def _late_mass(model: LogNormal, ages: Sequence[float], cdf: Sequence[float], x: float,
               const_from: int | None = None) -> float:
    """P(delay > x * T) for reads at ``ages`` from age 0 (``cdf`` = the model's CDF there).
    A job done in (t[k-1], t[k]] is late when done before t[k] / (1 + x). From ``const_from``
    on the gaps are all equal: once one is at most x times its start, so are the rest."""
    total, prev, prev_f = 0.0, 0.0, 0.0
    for k, t in enumerate(ages):
        if t - prev > x * prev:
            total += model.cdf(t / (1.0 + x)) - prev_f
        elif const_from is not None and k > const_from:
            break
        prev, prev_f = t, cdf[k]
    return total


def _ratio_quantile(model: LogNormal, ages: Sequence[float], cdf: Sequence[float], q: float,
                    const_from: int | None = None) -> float:
    def late(x: float) -> float:
        return _late_mass(model, ages, cdf, x, const_from)
    lo, hi = 0.0, 1.0
    while late(hi) > 1.0 - q and hi < 1e6:
        lo, hi = hi, hi * 4.0
    for _ in range(36):
        mid = 0.5 * (lo + hi)
        if late(mid) > 1.0 - q:
            lo = mid
        else:
            hi = mid
    return hi


def ratio_quantile(model: LogNormal, reads: Sequence[float], q: float = 0.95) -> float:
    """The ``q`` quantile of delay/duration when reading at ages ``reads`` (from age 0)."""
    return _ratio_quantile(model, reads, [model.cdf(t) for t in reads], q)


def schedule_metrics(model: LogNormal, reads: Sequence[float], late_ratio: float) -> Metrics:
    """Expected cost of reading at ages ``reads`` (increasing, from age 0) until the job is
    found finished; the sequence should reach far into the tail (mass past it is ignored)."""
    n = delay = 0.0
    prev_f = prev_pm = 0.0
    cdf = []
    for t in reads:
        f, pm = model.cdf(t), model.partial_mean(t)
        n += 1.0 - prev_f
        delay += t * (f - prev_f) - (pm - prev_pm)
        prev_f, prev_pm = f, pm
        cdf.append(f)
    return Metrics(n, delay, _late_mass(model, reads, cdf, late_ratio), late_ratio)


def static_metrics(model: LogNormal, kind: str | None, q: float = 0.95,
                   max_reads: int = 2_000) -> Metrics:
    """The static schedule (without jitter) on ``model``, with ``late_ratio`` its ``q`` quantile
    of delay/duration. Past ``max_reads`` reads the constant interval is summed in closed form."""
    schedule = static_schedule(kind)
    ages = static_read_ages(kind, model.survival_quantile(1e-10), max_reads)
    cdf = [model.cdf(t) for t in ages]
    n = delay = 0.0
    prev_f = prev_pm = 0.0
    for t, f in zip(ages, cdf, strict=True):
        pm = model.partial_mean(t)
        n += 1.0 - prev_f
        delay += t * (f - prev_f) - (pm - prev_pm)
        prev_f, prev_pm = f, pm
    end = ages[-1]
    rest = 1.0 - prev_f
    if rest > 1e-12:  # reads every `step` seconds after `end`: E[(T - end)+] / step more, half a step late
        step = schedule[-1]
        n += ((model.mean - prev_pm) - end * rest) / step + 0.5 * rest
        delay += 0.5 * step * rest
    x = _ratio_quantile(model, ages, cdf, q, len(schedule))
    return Metrics(n, delay, _late_mass(model, ages, cdf, x, len(schedule)), x)


# -- the learned plan -------------------------------------------------------------------------------

@value
class LearnedPlan:
    """The learned read schedule of one model: a DP over ``ages`` (see the module docstring).

    ``values[j]`` is the optimal expected cost still to come (reads + multipliers x delay and
    lateness), not normalised by survival, after a read at ``ages[j]`` found the job running;
    ``reads`` the plan's read ages for a job never seen finished, from age 0; ``learned`` and
    ``static`` the expected cost of both schedules on the model.
    """

    model: LogNormal
    bounds: Bounds
    ages: tuple[float, ...]
    values: tuple[float, ...]
    lam_delay: float
    lam_late: float
    late_ratio: float
    tail_ratio: float
    expected: float
    reads: tuple[float, ...]
    learned: Metrics
    static: Metrics
    #: False when no plan met the targets or none read less than the static schedule on the
    #: model (e.g. a median near min_interval): next_delay then keeps the static schedule.
    feasible: bool
    cdf: tuple[float, ...]
    pmean: tuple[float, ...]
    late_cdf: tuple[float, ...]
    #: The late model (:func:`late_model`; ``model`` itself for a model without a stated error),
    #: its CDF at ages / (1 + LATE_ALLOWANCE x late_ratio) (empty without a shift) and the plan's
    #: share of jobs that late there (``learned.late``: the share later than ``late_ratio`` on
    #: ``model``).
    late_model: LogNormal
    shift_cdf: tuple[float, ...]
    late_shifted: float

    def next_read_age(self, last_running_age: float, age_now: float) -> float:
        """The best next read age after ``age_now`` for a job last seen running at
        ``last_running_age``: one step of the DP from that state (ages past the grid continue
        geometrically)."""
        m, lam1, lam2 = self.model, self.lam_delay, self.lam_late
        a = min(max(last_running_age, 0.0), age_now)
        fa, pa = m.cdf(a), m.partial_mean(a)
        shifted = self.shift_cdf
        la = self.late_model.cdf(a) if shifted else 0.0
        base = max(a, age_now)
        reach = _reach(base, self.bounds, self.expected, self.ages[0])
        best, best_cost = -1, math.inf
        for j, t in enumerate(self.ages):
            if t <= base:
                continue
            if best >= 0 and t > reach:
                break
            late = self.late_cdf[j] - fa
            cost = (lam1 * (t * (self.cdf[j] - fa) - (self.pmean[j] - pa)) + self.values[j]
                    + (lam2 * late if late > 0.0 else 0.0))
            if shifted and (late := shifted[j] - la) > 0.0:
                cost += lam2 * late
            if cost < best_cost:
                best, best_cost = j, cost
        if best < 0:  # older than the grid: geometric, within the bounds
            return max(a * self.tail_ratio, age_now)
        return self.ages[best]


def _reach(age: float, bounds: Bounds, expected: float, first: float) -> float:
    """The furthest read age the plan considers after a read at ``age``: the bounds' cap (or the
    minimum interval) and, from the grid's first age ``first`` on, at most _WINDOW times the age
    (a bound on the work, not on the schedule: a job's first read may land anywhere)."""
    limit = age + max(bounds.cap(age, expected), bounds.min_interval)
    return min(limit, age * _WINDOW) if age >= first else limit


def _grid(model: LogNormal, x: float) -> list[float]:
    """Log-spaced ages over the model's mass; the step divides log(1 + x) exactly when it can, so
    reads exactly (1 + x) apart (never late) are on the grid."""
    lo, hi = model.quantile(_P_LO), model.survival_quantile(_S_HI)
    span = math.log(hi / lo)
    step = max(math.log(_GRID_STEP), span / _GRID_MAX)
    per = math.log1p(x) / step
    if per >= 1.0:
        step = math.log1p(x) / math.ceil(per)
    n = min(_GRID_MAX, max(_GRID_MIN, math.ceil(span / step)))
    return [lo * math.exp(step * i) for i in range(n + 1)]


def _continue(model: LogNormal, start: float, ratio: float, bounds: Bounds, expected: float,
              x: float, lm: LogNormal, x2: float) -> tuple[float, float, float, float, list[float]]:
    """Cost parts of reading geometrically after a read at ``start`` found the job running:
    (reads, delay, mass later than ``x`` on ``model``, later than ``x2`` on ``lm``) unnormalised,
    and the read ages."""
    n = delay = late = late_lm = 0.0
    ages: list[float] = []
    t, f, pm = start, model.cdf(start), model.partial_mean(start)
    for _ in range(400):
        if 1.0 - f < 1e-12:
            break
        nt = t + bounds.limit(t * (ratio - 1.0), t, expected)
        nf, npm = model.cdf(nt), model.partial_mean(nt)
        n += 1.0 - f
        delay += nt * (nf - f) - (npm - pm)
        edge = nt / (1.0 + x)
        if edge > t:
            late += model.cdf(edge) - f
        if (edge2 := nt / (1.0 + x2)) > t:
            late_lm += lm.cdf(edge2) - lm.cdf(t)
        ages.append(nt)
        t, f, pm = nt, nf, npm
    return n, delay, late, late_lm, ages


@functools.lru_cache(maxsize=128)
def learned_plan(model: LogNormal, kind: str | None = None, bounds: Bounds = Bounds()) -> LearnedPlan:
    """Build (and cache) the learned plan of ``model``, against the static schedule of ``kind``
    (only short/long matters: :func:`next_delay` passes "image" or "video")."""
    static = static_metrics(model, kind)
    lm = late_model(model)
    x = static.late_ratio
    delay_target = DELAY_MARGIN * static.mean_delay
    late_target = LATE_SHARE
    expected = model.quantile(LATE_QUANTILE)

    ages = _grid(model, x)
    n = len(ages) - 1
    cdf = [model.cdf(t) for t in ages]
    pmean = [model.partial_mean(t) for t in ages]
    surv = [1.0 - f for f in cdf]
    # Lateness, both counted by the DP under the one multiplier: later than x on the model (fx),
    # and, when the fit states its error, later than x2 on the late model (fx2, lb).
    shift = lm is not model
    x2 = LATE_ALLOWANCE * x
    fx = [model.cdf(t / (1.0 + x)) for t in ages]
    fx2 = [lm.cdf(t / (1.0 + x2)) for t in ages] if shift else [0.0] * (n + 1)
    lb = [lm.cdf(t) for t in ages] if shift else [0.0] * (n + 1)
    acc = [t * f - p for t, f, p in zip(ages, cdf, pmean, strict=True)]  # t F(t) - E[T; T <= t]
    tail_ratio = 1.0 + min(x, bounds.age_fraction)
    tail_n, tail_d, tail_l, tail_l2, tail_ages = _continue(model, ages[n], tail_ratio, bounds, expected, x, lm, x2)
    if not shift:
        tail_l2 = 0.0

    def reach(t0: float, first: int) -> int:
        """The last grid index a read after age ``t0`` may land on (at least ``first``)."""
        limit = _reach(t0, bounds, expected, ages[0])
        j = first
        while j < n and ages[j + 1] <= limit:
            j += 1
        return j

    last = [reach(ages[i], i + 1) for i in range(n)]
    first0 = 0
    while first0 < n and ages[first0] < bounds.min_interval:
        first0 += 1
    last0 = reach(0.0, first0)

    # From state i, reads at j < split[i] find no job later than x (ages[j] / (1 + x) <= ages[i]),
    # at j < split2[i] none later than x2 on the late model.
    def splits(ratio: float) -> list[int]:
        edges = [t / (1.0 + ratio) for t in ages]
        return [min(max(bisect.bisect_right(edges, ages[i]), i + 1), last[i] + 1) for i in range(n)]

    split = splits(x)
    split2 = splits(x2) if shift else [last[i] + 1 for i in range(n)]

    def solve(lam1: float, lam2: float) -> tuple[list[float], list[int], int]:
        values = [0.0] * (n + 1)
        nxt = [n] * (n + 1)
        values[n] = tail_n + lam1 * tail_d + lam2 * (tail_l + tail_l2)
        g = [0.0] * (n + 1)  # lam1 (t F(t) - E[T; T <= t]) + value: the part of a move's cost set by its target
        h = [0.0] * (n + 1)  # the same, plus lam2 F(t / (1 + x)) for targets that make jobs late
        h2 = [0.0] * (n + 1)  # and plus lam2 F_late(t / (1 + x2)) for those that make them late there too
        g[n] = lam1 * acc[n] + values[n]
        h[n] = g[n] + lam2 * fx[n]
        h2[n] = h[n] + lam2 * fx2[n]
        for i in range(n - 1, -1, -1):
            fi = cdf[i]
            k1 = lam1 * fi
            best, arg = math.inf, i + 1
            mid, mid2, end = split[i], split2[i], last[i] + 1
            for j in range(i + 1, mid):
                c = g[j] - k1 * ages[j]
                if c < best:
                    best, arg = c, j
            late_off = lam2 * fi
            for j in range(mid, mid2):
                c = h[j] - k1 * ages[j] - late_off
                if c < best:
                    best, arg = c, j
            late_off += lam2 * lb[i]
            for j in range(mid2, end):
                c = h2[j] - k1 * ages[j] - late_off
                if c < best:
                    best, arg = c, j
            values[i] = surv[i] + best + lam1 * pmean[i]
            g[i] = lam1 * acc[i] + values[i]
            h[i] = g[i] + lam2 * fx[i]
            h2[i] = h[i] + lam2 * fx2[i]
            nxt[i] = arg
        best, arg = math.inf, first0
        for j in range(first0, last0 + 1):
            c = h2[j]
            if c < best:
                best, arg = c, j
        return values, nxt, arg

    def evaluate(lam1: float, lam2: float) -> tuple[Metrics, float, list[float], list[int]]:
        """The plan of (lam1, lam2): its metrics on the model, its late share on the late model."""
        values, nxt, j = solve(lam1, lam2)
        reads = delay = late = late2 = 0.0
        f_prev = pm_prev = t_prev = l_prev = 0.0
        chain = []
        while True:
            chain.append(j)
            reads += 1.0 - f_prev
            delay += ages[j] * (cdf[j] - f_prev) - (pmean[j] - pm_prev)
            if ages[j] / (1.0 + x) > t_prev:
                late += fx[j] - f_prev
            if shift and ages[j] / (1.0 + x2) > t_prev:
                late2 += fx2[j] - l_prev
            f_prev, pm_prev, t_prev, l_prev = cdf[j], pmean[j], ages[j], lb[j]
            if j == n:
                break
            j = nxt[j]
        return Metrics(reads + tail_n, delay + tail_d, late + tail_l, x), late2 + tail_l2, values, chain

    feasible: list[tuple[float, float, float]] = []  # (reads, lam1, lam2) of plans meeting every target

    def run(lam1: float, lam2: float) -> Metrics:
        m, shifted = evaluate(lam1, lam2)[:2]
        if m.mean_delay <= delay_target and max(m.late, shifted) <= late_target:
            feasible.append((m.reads, lam1, lam2))
        return m

    # Multipliers in log2; lam_delay is per second, so its range follows the model's median.
    # For each lam_late on a ladder (0 first, then factors of 4), bisect the smallest lam_delay
    # meeting the delay target (it shrinks as lam_late grows: each rung starts from the last);
    # then rungs around the best at factors 2, 1.4, 1.2 (_REFINE: a coarser search left a late
    # share of 3 % unspent, 4-7 % of a video's reads). Every plan meeting every target is a
    # candidate and the one with the fewest reads wins. (The DP is discrete: the constraints are
    # step functions of the multipliers, which a plain nested bisection can step over.)
    l1_lo, l1_hi = -math.log2(model.median) - 14.0, -math.log2(model.median) + 10.0

    def rung(l2: float, hi: float) -> float:
        """The smallest log2 lam_delay in [l1_lo, hi] meeting the delay target with lam_late = l2."""
        lam2 = 2.0**l2 if l2 > _L2_MIN else 0.0
        if run(2.0**hi, lam2).mean_delay > delay_target:
            return hi
        lo = l1_lo
        for _ in range(_SEARCH_STEPS):
            mid = 0.5 * (lo + hi)
            if run(2.0**mid, lam2).mean_delay <= delay_target:
                hi = mid
            else:
                lo = mid
        return hi

    hi = l1_hi
    for l2 in _LATE_LADDER:
        hi = rung(l2, min(l1_hi, hi + 1.0))
    for step in _REFINE:
        if not feasible:
            break
        best = min(feasible)[2]
        centre = math.log2(best) if best > 0 else _L2_MIN
        for l2 in (centre - step, centre + step):
            if l2 > _L2_MIN:
                rung(l2, l1_hi)
    if feasible:
        _, lam1, lam2 = min(feasible)
    else:  # the targets are out of the grid's reach: next_delay keeps the static schedule
        lam1, lam2 = 2.0**l1_hi, 2.0 ** _LATE_LADDER[-1]
    metrics, shifted, values, chain = evaluate(lam1, lam2)
    return LearnedPlan(model=model, bounds=bounds, ages=tuple(ages), values=tuple(values), lam_delay=lam1,
                lam_late=lam2, late_ratio=x, tail_ratio=tail_ratio, expected=expected,
                reads=tuple(ages[j] for j in chain) + tuple(tail_ages), learned=metrics, static=static,
                feasible=bool(feasible) and metrics.reads < static.reads,
                cdf=tuple(cdf), pmean=tuple(pmean), late_cdf=tuple(fx), late_model=lm,
                shift_cdf=tuple(fx2) if shift else (), late_shifted=shifted)


def late_model(model: LogNormal) -> LogNormal:
    """The model the plan's late share is also held on: ``model`` moved earlier by LATE_SE
    standard errors of its LATE_TAIL quantile, the error its fit states (at most LATE_SHIFT_MAX
    log seconds, also when the fit could not state one); ``model`` itself when it was given, not
    fitted (no error stated). Moving, not widening: a plan's reads past its first are nearly
    geometric, so only where the first read falls against the lower tail is at stake."""
    shift = LATE_SE * model.log_quantile_se(LATE_TAIL)
    if not shift > 0.0:
        return model
    return LogNormal(model.mu - min(shift, LATE_SHIFT_MAX), model.sigma)


# -- the entry point ------------------------------------------------------------------------------

def next_delay(kind: str | None, attempt: int, age: float, last_running_age: float | None,
               model: LogNormal | None, bounds: Bounds, hint: float | None = None,
               rng: random.Random | None = None) -> float:
    """Seconds until the next status read of a job ``age`` seconds old whose last read that
    saw it running was at ``last_running_age`` (None: never seen running).

    Static schedule (read number ``attempt``) without a model, the learned plan with one; then
    :class:`Bounds`, then Sume's hint (``next_poll_after_seconds``) as a lower bound.
    """
    age = max(0.0, age)
    if model is None:
        delay = bounds.limit(static_delay(kind, attempt, rng), age, _static_expected(kind))
    else:
        plan = learned_plan(model, "video" if kind in LONG_KINDS else "image", bounds)
        if not plan.feasible:
            return next_delay(kind, attempt, age, last_running_age, None, bounds, hint, rng)
        target = plan.next_read_age(last_running_age or 0.0, age)
        delay = bounds.limit(jittered(target - age, LEARNED_JITTER, rng), age, plan.expected)
    if hint is not None and hint > delay:  # NaN compares False: ignored
        delay = float(hint)
    return delay


# -- ordering under a binding read budget -----------------------------------------------------------

def read_priority(model: LogNormal | None, last_running_age: float | None, age_now: float) -> float:
    """P(a read now finds the job finished | running at ``last_running_age``); 1 without a
    model (plain FIFO)."""
    if model is None:
        return 1.0
    return model.conditional_cdf(age_now, last_running_age or 0.0)


def max_wait(priority: float, w0: float = DEFAULT_W0) -> float:
    """The longest slot wait (s) a job accepts: ``w0`` times the odds ``p / (1 - p)`` that the
    read finds it finished (inf at 1, 0 at 0). Under a binding budget the limiter's queue wait
    ``W`` then admits exactly the jobs with ``p >= W / (W + w0)``: the threshold rises with
    the queue, so scarce reads go to the jobs most likely done."""
    if priority >= 1.0:
        return math.inf
    if not priority > 0.0:
        return 0.0
    return w0 * priority / (1.0 - priority)


def defer_delay(model: LogNormal | None, last_running_age: float | None, age_now: float, wait: float,
                w0: float, bounds: Bounds) -> float:
    """After refusing a slot ``wait`` seconds away: seconds until the job would accept what is
    left of that wait if the queue just drained, i.e. the smallest ``d`` with
    ``max_wait(priority at age_now + d) >= wait - d`` (so never later than the refused slot),
    within ``bounds``' minimum and maximum interval. Coming back and asking again costs a
    message, not a Sume read."""
    if not math.isfinite(wait) or wait <= 0:
        return bounds.min_interval if math.isfinite(wait) else bounds.max_interval
    if model is None:
        return max(bounds.min_interval, min(wait, bounds.max_interval))
    a = min(max(last_running_age or 0.0, 0.0), age_now)
    log_sa = model.log_sf(a)

    def accepts(d: float) -> bool:
        left = wait - d
        if left <= 0:
            return True
        p = -math.expm1(model.log_sf(age_now + d) - log_sa) if math.isfinite(log_sa) else 1.0
        return max_wait(p, w0) >= left

    lo, hi = 0.0, wait
    if not accepts(lo):
        for _ in range(30):
            mid = 0.5 * (lo + hi)
            if accepts(mid):
                hi = mid
            else:
                lo = mid
            if hi - lo < 0.01 * bounds.min_interval:
                break
    else:
        hi = 0.0
    return max(bounds.min_interval, min(hi, bounds.max_interval))


def overdue(gap_since_last_read: float, pending_jobs: int, read_rate_per_second: float,
            factor: float = DEFAULT_OVERDUE_FACTOR) -> bool:
    """The max-gap backstop: a job unread for ``factor`` round-robin periods (pending jobs /
    read rate) takes any slot."""
    if not read_rate_per_second > 0:
        return False
    return gap_since_last_read >= factor * max(pending_jobs, 0) / read_rate_per_second


# -- profiles -------------------------------------------------------------------------------------

_DURATION_KEYS = ("duration_seconds", "duration", "length")
#: Compiled at their first use (re's cache): only submit reads a job's create parameters, not every function
#: that imports the planner (two patterns: about 0.8 M instructions of the poll function's cold start).
_LINES = r"^\s*(\d{3,4})\s*[pP]\s*$"
_SIZE = r"^\s*(\d{2,5})\s*[xX*]\s*(\d{2,5})\s*$"
_NAMED = {"sd": 480, "hd": 720, "fhd": 1080, "full_hd": 1080, "2k": 1440, "qhd": 1440, "4k": 2160, "uhd": 2160}


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        v = float(value)
    elif isinstance(value, str):
        try:
            v = float(value.strip().rstrip("sS"))
        except ValueError:
            return None
    else:
        return None
    return v if math.isfinite(v) and v > 0 else None


def _pixels(params: Mapping[str, object]) -> float | None:
    width, height = _number(params.get("width")), _number(params.get("height"))
    if width and height:
        return width * height
    for key in ("resolution", "size"):
        value = params.get(key)
        if isinstance(value, str):
            text = value.strip().lower()
            if m := re.match(_SIZE, text):
                return float(m.group(1)) * float(m.group(2))
            lines = float(_NAMED[text]) if text in _NAMED else None
            if lines is None and (m := re.match(_LINES, text)):
                lines = float(m.group(1))
            if lines:
                return lines * lines * 16.0 / 9.0
        number = _number(value)
        if number is not None and key == "resolution" and number < 10_000:  # 1080: lines
            return number * number * 16.0 / 9.0
    return None


def profile_key(kind: str, params: Mapping[str, object] | None) -> str:
    """A finer model key than the kind from create parameters that predict duration: a numeric
    ``duration``/``duration_seconds``/``length`` on a log2 scale (``|d16``), and the pixel count
    (``resolution``, ``size`` or ``width`` x ``height``) in powers-of-2 megapixels (``|mp2``).
    E.g. ``"video"`` or ``"video|d16|mp2"``. The caller falls back to the kind's model when a
    profile has too few observations."""
    if not params:
        return kind
    parts = [kind]
    for key in _DURATION_KEYS:
        seconds = _number(params.get(key))
        if seconds is not None:
            if 0.5 <= seconds <= 86_400:
                parts.append(f"d{2 ** round(math.log2(seconds)):g}")
            break
    pixels = _pixels(params)
    if pixels is not None and 1e4 <= pixels <= 1e9:
        mp = 2.0 ** round(math.log2(pixels / 1e6))
        parts.append(f"mp{mp:g}")
    return "|".join(parts)
