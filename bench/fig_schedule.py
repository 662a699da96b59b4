"""Figure 7: where status reads land - the learned schedule against static ones and the optimum.

A model-level simulation (no AWS, no Redis, no Sume; numpy/scipy/matplotlib belong to this
figure only, never to the layer). One run, one seed, synthetic workload: 1,000 jobs, about a
third each of image (median 20 s, sigma 0.4), video (6 min, 0.6) and ad video (12 min, 0.5) with
log-normal durations, arriving over time; Sume sends no hint. Four schedulers on the same jobs:

* fixed: a read every 5 s;
* static: ``schedule.static_delay`` (the cold-start schedule, through ``next_delay`` without a model);
* learned: ``schedule.next_delay`` with the model ``durations.fit_lognormal`` fitted per kind on the
  interval-censored observations (last read running, first read terminal) of the first 200
  jobs, polled with the static schedule as a cold start; used for the other 800;
* optimum: for the TRUE distribution, offline dynamic programming on a fine log-spaced grid
  (numpy), minimising reads per job subject to a mean detection delay and a 95th percentile
  of delay/duration no worse than the static schedule's (two Lagrange multipliers).

Figures are measured on the 800 jobs after the warm-up, pooled and per kind: each kind's mean
delay and 95th percentile of delay/duration against the static schedule's on the same jobs
(within 5 %: the learned plan holds static's figures per model and still within 5 % when the
model is off by twice the error its fit states; 260-270 jobs a kind also leave a few per cent of
sampling noise), and the reads each kind saves. Then a binding budget: 2,000 jobs
pending at once (same mix), 120 reads/min, an event simulation of the shared limiter (GCRA with
reservations: each granted read takes the next slot, 0.5 s apart, FIFO by request time): plain
FIFO (every job asks at submission and again right after each read, and takes every slot)
against the learned ordering (the learned schedule says when to ask; ``read_priority`` and
``max_wait`` whether to take the slot offered; ``defer_delay`` when to ask again; ``overdue`` the
backstop). Also shown: FIFO on the static schedule, each half of the learned ordering alone, the
clairvoyant bound (one read per job, right at completion) and, in the full run, a central greedy
index (every slot to the job most likely finished) and a sweep of w0 and the backstop factor.

``python -m bench.fig_schedule [--quick] [--seed N]``; ``--seeds N``: the unbudgeted targets over
N seeds instead (how the layer's safety margins were chosen; ``--quick --seeds 80``, 2 minutes). The plot goes to
.scratch/bench-schedule.png.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import ndtr

from bench import SCRATCH
from bench.report import Row, print_table
from sume_poller.schedule import planner as schedule
from sume_poller.schedule.durations import Interval, LogNormal, model_from, summary
from sume_poller.schedule.planner import Bounds

KINDS: dict[str, tuple[float, float]] = {"image": (20.0, 0.4), "video": (360.0, 0.6), "ad_video": (720.0, 0.5)}
JOBS, WARMUP = 1_000, 200
ARRIVALS_PER_SECOND = 0.2
FIXED_INTERVAL = 5.0
BUDGET_JOBS = 2_000
READS_PER_MINUTE = 120
#: Production's ScheduleSettings defaults.
BOUNDS = Bounds(min_interval=2.0, max_interval=1_800.0, age_fraction=0.5)
SEED = 7
SCHEDULERS = ("fixed", "static", "learned", "optimum")
TARGET_READS, TARGET_DELAY, TARGET_P95, TARGET_VS_OPT = 0.7, 1.0, 1.0, 1.15
#: Per kind: mean delay and p95 of delay/duration, learned / static (the fit's stated margin).
TARGET_KIND = 1.05
TARGET_BUDGET_DELAY, TARGET_GAP = 0.6, 2.0


@dataclass(frozen=True)
class Job:
    kind: str
    arrival: float
    duration: float


@dataclass
class Outcome:
    """One scheduler on one set of jobs."""

    reads: list[int] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)

    def add(self, reads: int, delay: float, duration: float) -> None:
        self.reads.append(reads)
        self.delays.append(delay)
        self.durations.append(duration)

    def reads_per_job(self) -> float:
        return float(np.mean(self.reads))

    def mean_delay(self) -> float:
        return float(np.mean(self.delays))

    def ratio_quantile(self, q: float) -> float:
        return float(np.quantile(np.asarray(self.delays) / np.asarray(self.durations), q))

    def merged(self, other: Outcome) -> Outcome:
        return Outcome(self.reads + other.reads, self.delays + other.delays, self.durations + other.durations)


def workload(n: int, rng: random.Random, spread: bool = True) -> list[Job]:
    kinds = list(KINDS)
    jobs, t = [], 0.0
    for i in range(n):
        if spread:
            t += rng.expovariate(ARRIVALS_PER_SECOND)
        kind = kinds[i % len(kinds)] if not spread else rng.choice(kinds)
        median, sigma = KINDS[kind]
        jobs.append(Job(kind, t, median * math.exp(sigma * rng.gauss(0.0, 1.0))))
    return jobs


# -- the layer's schedulers, one job at a time ------------------------------------------------------

def poll_with_layer(job: Job, model: LogNormal | None, bounds: Bounds, rng: random.Random,
                    clamp: Callable[[float, float], float] | None = None) -> tuple[int, float, Interval]:
    """Read on ``next_delay`` until the job is done: (reads, delay, the interval observed)."""
    age, last, attempt = 0.0, None, 0
    while True:
        delay = schedule.next_delay(job.kind, attempt, age, last, model, bounds, rng=rng)
        if clamp is not None:
            delay = clamp(delay, age)
        age += delay
        attempt += 1
        if age >= job.duration:
            return attempt, age - job.duration, Interval(last or 0.0, age)
        last = age


def poll_at(job: Job, read_ages: np.ndarray) -> tuple[int, float]:
    k = int(np.searchsorted(read_ages, job.duration))
    return k + 1, float(read_ages[k] - job.duration)


# -- the optimum for the true distribution (numpy) --------------------------------------------------

@dataclass
class Optimum:
    read_ages: np.ndarray
    reads: float
    mean_delay: float
    late: float
    lam_delay: float
    lam_late: float
    solves: int


def optimum(median: float, sigma: float, delay_target: float, x: float, points: int, alpha: float = 0.05,
            ladder_step: float = 1.0, steps: int = 12) -> Optimum:
    """Fewest expected reads for T ~ LogNormal(log median, sigma) with mean delay <= ``delay_target``
    and P(delay > x T) <= ``alpha``: DP over a fine log grid for reads + l1 delay + l2 lateness,
    l2 on a ladder, l1 bisected per rung; the feasible plan with the fewest reads."""
    mu = math.log(median)
    z = np.linspace(-5.3, 6.0, points)
    t = np.exp(mu + sigma * z)
    cdf = ndtr(z)
    mean = math.exp(mu + sigma * sigma / 2)
    pmean = mean * ndtr(z - sigma)
    acc = t * cdf - pmean
    fx = ndtr((np.log(t / (1 + x)) - mu) / sigma)
    surv = 1.0 - cdf
    window = np.searchsorted(t, t * 6.0, side="right")
    m = points

    def solve(l1: float, l2: float) -> np.ndarray:
        """The read indices of the optimal plan for reads + l1 delay + l2 lateness, from age 0."""
        values = np.zeros(m)
        nxt = np.full(m, m - 1)
        values[m - 1] = surv[m - 1]
        g = l1 * acc + values
        for i in range(m - 2, -1, -1):
            hi = max(int(window[i]), i + 2)
            js = slice(i + 1, hi)
            c = g[js] - l1 * cdf[i] * t[js] + l2 * np.maximum(fx[js] - cdf[i], 0.0)
            k = int(np.argmin(c))
            values[i] = surv[i] + c[k] + l1 * pmean[i]
            g[i] = l1 * acc[i] + values[i]
            nxt[i] = i + 1 + k
        c0 = g + l2 * fx
        j = int(np.argmin(c0))
        chain = [j]
        while j < m - 1:
            j = int(nxt[j])
            chain.append(j)
        return np.asarray(chain)

    def metrics(chain: np.ndarray) -> tuple[float, float, float]:
        f_prev = np.concatenate(([0.0], cdf[chain[:-1]]))
        pm_prev = np.concatenate(([0.0], pmean[chain[:-1]]))
        t_prev = np.concatenate(([0.0], t[chain[:-1]]))
        reads = float(np.sum(1.0 - f_prev))
        delay = float(np.sum(t[chain] * (cdf[chain] - f_prev) - (pmean[chain] - pm_prev)))
        late = float(np.sum(np.where(t[chain] / (1 + x) > t_prev, fx[chain] - f_prev, 0.0)))
        return reads, delay, late

    solves = 0
    feasible: list[tuple[float, float, float, float, float]] = []
    scale = -math.log2(median)
    ladder = [0.0, *(2.0 ** (k * ladder_step) for k in range(int(-4 / ladder_step), int(16 / ladder_step) + 1))]
    for l2 in ladder:
        lo, hi = scale - 16.0, scale + 10.0
        for probe in (hi, *([None] * steps)):
            v = probe if probe is not None else 0.5 * (lo + hi)
            chain = solve(2.0**v, l2)
            solves += 1
            reads, delay, late = metrics(chain)
            if delay <= delay_target and late <= alpha:
                feasible.append((reads, delay, late, 2.0**v, l2))
            if probe is not None:
                if delay > delay_target:
                    break
                continue
            if delay <= delay_target:
                hi = v
            else:
                lo = v
    reads, delay, late, l1, l2 = min(feasible)
    ages = t[solve(l1, l2)]
    tail = [ages[-1] * 1.2**k for k in range(1, 200)]
    return Optimum(np.concatenate((ages, tail)), reads, delay, late, l1, l2, solves)


# -- the binding budget -------------------------------------------------------------------------------

@dataclass
class BudgetResult:
    mean_delay: float
    max_gap: float
    reads_per_job: float
    makespan: float
    refusals: int


def budget_run(jobs: Sequence[Job], models: dict[str, LogNormal] | None, bounds: Bounds, *, w0: float,
               factor: float, rng: random.Random, plain: bool = False, order: bool = True,
               learned: bool = True) -> BudgetResult:
    """Every job submitted at t = 0 (in list order); a GCRA limiter with reservations grants
    slots 60/rate apart, FIFO by request time. ``models``: the learned ordering (learned
    schedule, priority, max_wait, defer, backstop; ``order`` False: the learned schedule with every
    slot taken; ``learned`` False: asking on the static schedule, ordered with the models).
    Without: every job takes every slot, asking on the static schedule, or (``plain``) at
    submission and again right after each read."""
    rate = READS_PER_MINUTE / 60.0
    spacing = 1.0 / rate
    n = len(jobs)
    last_read = [0.0] * n
    last_running: list[float | None] = [None] * n
    attempts = [0] * n
    reads = [0] * n
    delays = [0.0] * n
    max_gap = 0.0
    pending = n
    tat = 0.0
    refusals = 0
    heap: list[tuple[float, int, int, int]] = []  # (time, seq, kind: 0 request / 1 read, job)
    seq = 0

    def model_of(i: int) -> LogNormal | None:
        return None if models is None else models.get(jobs[i].kind)

    def push(at: float, what: int, i: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (at, seq, what, i))

    def delay_of(i: int, attempt: int, age: float, last: float | None) -> float:
        if plain and models is None:
            return 0.0
        return schedule.next_delay(jobs[i].kind, attempt, age, last, model_of(i) if learned else None, bounds,
                                   rng=rng)

    for i in range(n):
        push(delay_of(i, 0, 0.0, None), 0, i)
    now = 0.0
    while heap:
        now, _, what, i = heapq.heappop(heap)
        job = jobs[i]
        if what == 0:  # asks the limiter for a slot
            slot = max(now, tat)
            wait = slot - now
            model = model_of(i)
            if model is not None and order:
                gap = now - last_read[i]
                p = schedule.read_priority(model, last_running[i], now)
                if not (schedule.overdue(gap, pending, rate, factor) or wait <= schedule.max_wait(p, w0)):
                    refusals += 1
                    later = schedule.defer_delay(model, last_running[i], now, wait, w0, bounds)
                    until_overdue = factor * pending / rate - gap
                    push(now + max(min(later, until_overdue), spacing), 0, i)
                    continue
            tat = slot + spacing
            push(slot, 1, i)
            continue
        reads[i] += 1  # a read at age `now` (everything was submitted at 0)
        max_gap = max(max_gap, now - last_read[i])
        last_read[i] = now
        if now >= job.duration:
            delays[i] = now - job.duration
            pending -= 1
            continue
        last_running[i] = now
        attempts[i] += 1
        push(now + delay_of(i, attempts[i], now, now), 0, i)
    return BudgetResult(float(np.mean(delays)), max_gap, float(np.mean(reads)), now, refusals)


def clairvoyant(jobs: Sequence[Job]) -> float:
    """Mean delay if each job were read exactly once, as soon as possible after it finished."""
    spacing = 60.0 / READS_PER_MINUTE
    t, total = -math.inf, 0.0
    for d in sorted(j.duration for j in jobs):
        t = max(t + spacing, d)
        total += t - d
    return total / len(jobs)


def greedy_index(jobs: Sequence[Job]) -> float:
    """Mean delay when every slot goes to the pending job most likely finished given its last
    read (true distributions, never idle): the myopic index policy a central scheduler would run."""
    from scipy.special import log_ndtr

    spacing = 60.0 / READS_PER_MINUTE
    mu = np.array([math.log(KINDS[j.kind][0]) for j in jobs])
    sigma = np.array([KINDS[j.kind][1] for j in jobs])
    durations = np.array([j.duration for j in jobs])

    def log_sf(t: np.ndarray) -> np.ndarray:
        return np.asarray(log_ndtr(-(np.log(np.maximum(t, 1e-9)) - mu) / sigma))

    last = np.zeros(len(jobs))
    pending = np.ones(len(jobs), dtype=bool)
    delays = np.zeros(len(jobs))
    t = 0.0
    while pending.any():
        t += spacing
        p = np.where(pending, -np.expm1(log_sf(np.full(len(jobs), t)) - log_sf(last)), -1.0)
        i = int(np.argmax(p))
        if durations[i] <= t:
            pending[i] = False
            delays[i] = t - durations[i]
        else:
            last[i] = t
    return float(delays.mean())


# -- the figure -----------------------------------------------------------------------------------

def _ratio(a: float, b: float) -> float:
    return a / b if b else math.inf


def _line(name: str, value: float, target: float | None = None, fmt: str = "{:.3f}") -> str:
    text = f"schedule {name}: {fmt.format(value)}"
    return text + (f" (target <= {target:g})" if target is not None else "")


def _plot(path: str, results: dict[str, dict[str, Outcome]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    colors = {"fixed": "tab:gray", "static": "tab:blue", "learned": "tab:green", "optimum": "tab:red"}
    offsets = {"fixed": (6, 4), "static": (6, 4), "learned": (6, -10), "optimum": (6, 6)}
    for ax, scope in zip(axes, ["pooled", *KINDS], strict=True):
        for name in SCHEDULERS:
            o = results[name][scope]
            ax.scatter(o.reads_per_job(), o.mean_delay(), s=60, color=colors[name], label=name)
            ax.annotate(name, (o.reads_per_job(), o.mean_delay()), textcoords="offset points",
                        xytext=offsets[name], fontsize=8)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(scope)
        ax.set_xlabel("status reads per job")
        ax.set_ylabel("mean detection delay (s)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Figure 7: reads per job vs mean detection delay (800 jobs after a 200-job warm-up)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def optima_for(quick: bool) -> dict[str, Optimum]:
    """The optimum per kind for the true distribution, against the static schedule's figures there."""
    optima: dict[str, Optimum] = {}
    for kind, (median, sigma) in KINDS.items():
        st = schedule.static_metrics(LogNormal(math.log(median), sigma), kind)
        optima[kind] = optimum(median, sigma, st.mean_delay, st.late_ratio, points=800 if quick else 1_200)
    return optima


@dataclass
class Run:
    """The unbudgeted part of one seed."""

    results: dict[str, dict[str, Outcome]]
    models: dict[str, LogNormal | None]
    observed: dict[str, list[Interval]]
    literal: Outcome
    fit_ms: float
    plan_ms: dict[str, float]
    jobs: int


def simulate(seed: int, optima: dict[str, Optimum]) -> Run:
    """1,000 jobs; the first 200 on the static schedule (cold start) give the observations the
    learned schedule is fitted on; the four schedulers poll the other 800."""
    jobs = workload(JOBS, random.Random(seed))
    warm, rest = jobs[:WARMUP], jobs[WARMUP:]
    observed: dict[str, list[Interval]] = {k: [] for k in KINDS}
    jitter = random.Random(seed + 1)
    for job in warm:
        observed[job.kind].append(poll_with_layer(job, None, BOUNDS, jitter)[2])
    fit_started = time.perf_counter()
    models = {k: model_from(v) for k, v in observed.items()}
    fit_ms = (time.perf_counter() - fit_started) * 1000 / len(KINDS)
    plan_ms: dict[str, float] = {}
    for kind, model in models.items():
        if model is not None:
            schedule.learned_plan.cache_clear()
            t0 = time.perf_counter()
            schedule.learned_plan(model, "video" if kind in ("video", "ad_video") else "image", BOUNDS)
            plan_ms[kind] = (time.perf_counter() - t0) * 1000

    results: dict[str, dict[str, Outcome]] = {name: {k: Outcome() for k in KINDS} for name in SCHEDULERS}
    literal: dict[str, Outcome] = {k: Outcome() for k in KINDS}
    streams = {name: random.Random(seed + 2) for name in (*SCHEDULERS, "literal")}

    def literal_cap(delay: float, age: float) -> float:  # the age cap read literally, from age 0
        return max(BOUNDS.min_interval, min(delay, BOUNDS.age_fraction * age))

    for job in rest:
        k = math.ceil(job.duration / FIXED_INTERVAL)
        results["fixed"][job.kind].add(k, k * FIXED_INTERVAL - job.duration, job.duration)
        n, d, _ = poll_with_layer(job, None, BOUNDS, streams["static"])
        results["static"][job.kind].add(n, d, job.duration)
        n, d, _ = poll_with_layer(job, models[job.kind], BOUNDS, streams["learned"])
        results["learned"][job.kind].add(n, d, job.duration)
        n, d = poll_at(job, optima[job.kind].read_ages)
        results["optimum"][job.kind].add(n, d, job.duration)
        n, d, _ = poll_with_layer(job, models[job.kind], BOUNDS, streams["literal"], clamp=literal_cap)
        literal[job.kind].add(n, d, job.duration)
    for name in SCHEDULERS:
        pooled = Outcome()
        for kind in KINDS:
            pooled = pooled.merged(results[name][kind])
        results[name]["pooled"] = pooled
    literal_pooled = Outcome()
    for kind in KINDS:
        literal_pooled = literal_pooled.merged(literal[kind])
    return Run(results, models, observed, literal_pooled, fit_ms, plan_ms, len(rest))


def _targets_met(results: dict[str, dict[str, Outcome]]) -> dict[str, float]:
    learned, static, best = results["learned"], results["static"], results["optimum"]
    lp, sp = learned["pooled"], static["pooled"]
    figures = {"reads": _ratio(lp.reads_per_job(), sp.reads_per_job()),
               "mean delay": _ratio(lp.mean_delay(), sp.mean_delay()),
               "p95 delay/duration": _ratio(lp.ratio_quantile(0.95), sp.ratio_quantile(0.95))}
    for kind in KINDS:
        lk, sk = learned[kind], static[kind]
        figures[f"mean delay {kind}"] = _ratio(lk.mean_delay(), sk.mean_delay())
        figures[f"p95 delay/duration {kind}"] = _ratio(lk.ratio_quantile(0.95), sk.ratio_quantile(0.95))
    for kind in KINDS:
        figures[f"vs optimum {kind}"] = _ratio(learned[kind].reads_per_job(), best[kind].reads_per_job())
    return figures


def robustness(seeds: int, quick: bool = True, out: Callable[[str], None] = print) -> None:
    """The unbudgeted targets over ``seeds`` seeds (how the layer's margins were chosen)."""
    optima = optima_for(quick)
    per_kind = {f"{name} {k}": TARGET_KIND for k in KINDS for name in ("mean delay", "p95 delay/duration")}
    limits = {"reads": TARGET_READS, "mean delay": TARGET_DELAY, "p95 delay/duration": TARGET_P95, **per_kind,
              **{f"vs optimum {k}": TARGET_VS_OPT for k in KINDS}}
    figures = [_targets_met(simulate(seed, optima).results) for seed in range(seeds)]
    for name, limit in limits.items():
        values = [f[name] for f in figures]
        out(f"schedule seeds {name}: mean {np.mean(values):.3f}, worst {max(values):.3f}, "
            f"missed in {sum(v > limit for v in values)} of {seeds} (target <= {limit:g})")
    kinds_met = sum(all(f[n] <= lim for n, lim in per_kind.items()) for f in figures)
    out(f"schedule seeds every kind's mean delay and p95 met: {kinds_met} of {seeds}")
    met = sum(all(f[n] <= lim for n, lim in limits.items()) for f in figures)
    out(f"schedule seeds all targets met: {met} of {seeds}")


def measure(quick: bool = False, seed: int = SEED, out: Callable[[str], None] = print) -> list[Row]:
    started = time.monotonic()
    run = simulate(seed, optima_for(quick))
    results, models, observed = run.results, run.models, run.observed
    fitted = {k: m for k, m in models.items() if m is not None}
    literal_pooled, fit_ms, plan_ms = run.literal, run.fit_ms, run.plan_ms

    rows: list[Row] = []
    lines: list[str] = []
    learned_r, static_r, optimum_r = results["learned"], results["static"], results["optimum"]

    # The table of everything, then the target lines.
    lines.append(f"schedule table ({run.jobs} jobs after a {WARMUP}-job warm-up; seed {seed}):")
    lines.append(f"  {'scheduler':9} {'scope':9} {'reads/job':>9} {'delay s':>8} {'p95 d/T':>8} {'p99 d/T':>8}")
    for name in SCHEDULERS:
        for scope in ("pooled", *KINDS):
            o = results[name][scope]
            lines.append(f"  {name:9} {scope:9} {o.reads_per_job():9.2f} {o.mean_delay():8.2f} "
                         f"{o.ratio_quantile(0.95):8.3f} {o.ratio_quantile(0.99):8.3f}")
    for kind, model in models.items():
        model_text = summary(model, len(observed[kind])) if model else "static (too few observations)"
        text = f"schedule model {kind}: {model_text} (true median {KINDS[kind][0]:g}, sigma {KINDS[kind][1]:g})"
        if model is not None:  # how far off the fit is where the plan's late jobs are, in its stated errors
            truth = LogNormal(math.log(KINDS[kind][0]), KINDS[kind][1])
            se = model.log_quantile_se(schedule.LATE_TAIL)
            off = math.log(model.quantile(schedule.LATE_TAIL) / truth.quantile(schedule.LATE_TAIL))
            text += (f"; its {schedule.LATE_TAIL:.0%} quantile {model.quantile(schedule.LATE_TAIL):.1f} s, true "
                     f"{truth.quantile(schedule.LATE_TAIL):.1f} s: {off / se:+.2f} stated errors of {se:.1%}")
        lines.append(text)
    out("\n".join(lines))
    lines = []

    def target(name: str, value: float, limit: float, measured: str, baseline: str, fmt: str = "{:.3f}") -> None:
        lines.append(_line(name, value, limit, fmt))
        rows.append(Row(f"7 schedule {name}", measured, baseline, value, f"<= {limit:g}", value <= limit))

    def info(name: str, value: float, measured: str, baseline: str, fmt: str = "{:.3f}") -> None:
        lines.append(_line(name, value, None, fmt))
        rows.append(Row(f"7 schedule {name}", measured, baseline, value, "-", None))

    lp, sp = learned_r["pooled"], static_r["pooled"]
    target("learned/static reads pooled", _ratio(lp.reads_per_job(), sp.reads_per_job()), TARGET_READS,
           f"learned {lp.reads_per_job():.2f} reads/job", f"static {sp.reads_per_job():.2f}")
    target("learned/static mean delay pooled", _ratio(lp.mean_delay(), sp.mean_delay()), TARGET_DELAY,
           f"learned {lp.mean_delay():.1f} s", f"static {sp.mean_delay():.1f} s")
    target("learned/static p95 delay/duration pooled", _ratio(lp.ratio_quantile(0.95), sp.ratio_quantile(0.95)),
           TARGET_P95, f"learned {lp.ratio_quantile(0.95):.3f}", f"static {sp.ratio_quantile(0.95):.3f}")
    for kind in KINDS:  # each kind against its own static schedule: no kind pays for another's savings
        lk, sk = learned_r[kind], static_r[kind]
        target(f"learned/static mean delay {kind}", _ratio(lk.mean_delay(), sk.mean_delay()), TARGET_KIND,
               f"learned {lk.mean_delay():.1f} s", f"static {sk.mean_delay():.1f} s")
        target(f"p95 delay/duration {kind}", _ratio(lk.ratio_quantile(0.95), sk.ratio_quantile(0.95)), TARGET_KIND,
               f"learned {lk.ratio_quantile(0.95):.3f}", f"static {sk.ratio_quantile(0.95):.3f}")
        info(f"reads saved {kind}", 1.0 - _ratio(lk.reads_per_job(), sk.reads_per_job()),
             f"learned {lk.reads_per_job():.2f} reads/job", f"static {sk.reads_per_job():.2f}", "{:.1%}")
    for kind in KINDS:
        lr, orr = learned_r[kind].reads_per_job(), optimum_r[kind].reads_per_job()
        target(f"learned/optimum reads {kind}", _ratio(lr, orr), TARGET_VS_OPT, f"learned {lr:.2f}",
               f"optimum {orr:.2f}")
    for scope in (*KINDS, "pooled"):
        info(f"optimum/static reads {scope}", _ratio(optimum_r[scope].reads_per_job(), static_r[scope].reads_per_job()),
             f"optimum {optimum_r[scope].reads_per_job():.2f}", f"static {static_r[scope].reads_per_job():.2f}")
    info("optimum/static mean delay pooled", _ratio(optimum_r["pooled"].mean_delay(), sp.mean_delay()),
         f"optimum {optimum_r['pooled'].mean_delay():.1f} s", f"static {sp.mean_delay():.1f} s")
    info("fixed-5s/static reads pooled", _ratio(results["fixed"]["pooled"].reads_per_job(), sp.reads_per_job()),
         f"fixed {results['fixed']['pooled'].reads_per_job():.2f}", f"static {sp.reads_per_job():.2f}")
    info("learned with the age cap from age 0 / static reads pooled",
         _ratio(literal_pooled.reads_per_job(), sp.reads_per_job()),
         f"{literal_pooled.reads_per_job():.2f} reads/job (cap 0.5 x age at every age)",
         f"static {sp.reads_per_job():.2f}")
    info("fit ms per kind", fit_ms, "fit_lognormal, ~67 intervals", "-", "{:.1f}")
    info("plan build ms max", max(plan_ms.values()) if plan_ms else 0.0,
         ", ".join(f"{k} {v:.0f}" for k, v in plan_ms.items()), "-", "{:.1f}")
    out("\n".join(lines))
    lines = []

    # The binding budget: 2,000 jobs at once, 120 reads/min.
    budget_jobs = workload(BUDGET_JOBS, random.Random(seed + 3), spread=False)
    period = BUDGET_JOBS / (READS_PER_MINUTE / 60.0)
    w0, factor = schedule.DEFAULT_W0, schedule.DEFAULT_OVERDUE_FACTOR

    def budget(**kwargs: Any) -> BudgetResult:
        return budget_run(budget_jobs, kwargs.pop("models", fitted), BOUNDS, rng=random.Random(seed + 4),
                          **{"w0": w0, "factor": factor, **kwargs})

    plain = budget(models=None, plain=True)
    static_fifo = budget(models=None)
    ordered = budget()
    target("budget learned/fifo mean delay", _ratio(ordered.mean_delay, plain.mean_delay), TARGET_BUDGET_DELAY,
           f"learned schedule + ordering {ordered.mean_delay:.0f} s ({ordered.reads_per_job:.2f} reads/job, "
           f"{ordered.refusals / BUDGET_JOBS:.1f} refused slots/job)",
           f"plain fifo {plain.mean_delay:.0f} s ({plain.reads_per_job:.2f} reads/job)")
    target("budget max gap / round-robin period", ordered.max_gap / period, TARGET_GAP,
           f"learned ordering max gap {ordered.max_gap:.0f} s",
           f"period {period:.0f} s (plain fifo {plain.max_gap:.0f} s)")
    info("budget learned/static-schedule fifo mean delay", _ratio(ordered.mean_delay, static_fifo.mean_delay),
         f"{ordered.mean_delay:.0f} s", f"static schedule, every slot taken: {static_fifo.mean_delay:.0f} s")
    alone = budget(order=False)
    info("budget learned schedule alone/static-schedule fifo mean delay",
         _ratio(alone.mean_delay, static_fifo.mean_delay), f"{alone.mean_delay:.0f} s (every slot taken)",
         f"{static_fifo.mean_delay:.0f} s")
    order_only = budget(learned=False)
    info("budget ordering alone/static-schedule fifo mean delay",
         _ratio(order_only.mean_delay, static_fifo.mean_delay),
         f"{order_only.mean_delay:.0f} s (static schedule asks, learned ordering)", f"{static_fifo.mean_delay:.0f} s")
    info("budget clairvoyant/static-schedule fifo mean delay", _ratio(clairvoyant(budget_jobs), static_fifo.mean_delay),
         f"{clairvoyant(budget_jobs):.0f} s (one read per job, at completion)", f"{static_fifo.mean_delay:.0f} s")
    if not quick:
        greedy = greedy_index(budget_jobs)
        info("budget greedy index/static-schedule fifo mean delay", _ratio(greedy, static_fifo.mean_delay),
             f"{greedy:.0f} s (every slot to the job most likely done, true distributions)",
             f"{static_fifo.mean_delay:.0f} s")
        for w in (10.0, 30.0, 120.0):
            for f in (0.5, 1.0):
                r = budget(w0=w, factor=f)
                info(f"budget sweep w0={w:g} factor={f:g} learned/fifo mean delay",
                     _ratio(r.mean_delay, plain.mean_delay),
                     f"{r.mean_delay:.0f} s, max gap {r.max_gap / period:.2f} periods, "
                     f"{r.refusals / BUDGET_JOBS:.1f} refusals/job", f"plain fifo {plain.mean_delay:.0f} s")
    out("\n".join(lines))

    SCRATCH.mkdir(exist_ok=True)
    png = SCRATCH / "bench-schedule.png"
    _plot(str(png), results)
    out(f"schedule plot: {png} ({time.monotonic() - started:.0f} s)")
    if rows:
        rows[0].notes.append(f"model-level simulation, seed {seed}; plot {png.name}; optimum grid "
                             f"{800 if quick else 1200} points")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fig_schedule", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="coarser optimum, no w0 sweep")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--seeds", type=int, help="instead: the unbudgeted targets over this many seeds")
    args = p.parse_args(argv)
    if args.seeds:
        robustness(args.seeds, quick=args.quick)
        return 0
    rows = measure(quick=args.quick, seed=args.seed)
    print_table(rows, "Figure 7: the learned read schedule", [])
    return 1 if any(r.passed is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
