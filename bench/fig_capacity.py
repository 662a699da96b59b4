"""Figure 10: how many jobs one key can serve, at Sume's documented read limits (120 a minute,
10,000 a day per key) - target lines ``capacity ...``, ``discovery ...``, ``webhooks ...`` and
``burst ...``.

Every run is figure 9's virtual-clock harness (:func:`bench.fig_discovery.big_run`): the real
Poller, Sweeper, WebhookReceiver, Budget and leases on a real redis-server and the Sume simulator
over HTTP, driven by an event heap on a virtual clock; figure 9's mix of kinds (image median
20 s, video 6 min, ad video 12 min; all completed, no hints, the static schedules); fan-out's
pending count and the sweep function every tick (60 clock seconds, the template's
``SweepPeriodMinutes``, unless a row says otherwise); the template's defaults (safety cadence
900 s, sweeps' lane 10 %). What is measured, side by side in one run:

* **Key capacity**: the largest steady arrival rate (Poisson, jobs a day) that one key finishes over
  a day - the backlog bounded (the mean pending count over the last eighth of the day at most 1.1x
  that over the eighth before the quarter mark, plus 5 jobs: at tens of pending jobs one tick's
  count, and even an eighth of a day's mean, is noise) and the p95 detection delay (Sume finishing a
  job -> its terminal record) at most 5 minutes - found by geometric bisection to 2.5 % (the
  rate served and the next one not within 1.025x: a verdict is not one step's noise), for chains only,
  chains + sweeps, and chains + webhooks with 30 % of deliveries lost (no sweeps). A probe whose
  backlog runs away (pending over 4x the quarter mark's and 40 more) stops there, failed. Where no
  rate meets the delay, the largest rate whose backlog stays bounded is the capacity printed beside
  it (``backlog only``). The limit is analytic: a client that learns of each completion for free
  pays one result read per job, from the day less what sweeps are kept to spend (their lane, 10 % of
  the day) - 9,000 jobs a day.
* **The day**: a full run simulates a whole UTC day from 00:00, the budget fresh. ``--quick``
  simulates its last 6 hours (4x shorter) with the limiter's day total three quarters spent at
  18:00 (``day_used``, as an evenly spent morning leaves it): the day is a total, so a steady
  stream has the same reads a second either way (a quarter of the budget over a quarter of the
  day), and the end-of-day reserve that decides whether a stream keeps up is the same.
* **1,000 pending long jobs**: a batch Sume works through over hours - each job queued most of its
  time, time to completion log-normal with a median of 4 hours (sigma 0.3: about 5,700
  completions a day at 1,000 pending) - started in its steady state (1,000 jobs submitted before
  the run, their ages as a running batch has them), new ones arriving to keep 1,000 pending; sweeps
  every 5 minutes (figure 9's 1,000-pending interval), chains only beside.
* **Webhooks, 30 % lost**: reads per finished job at half the limit's rate, every kind with
  webhooks, no sweeps.
* **List-miss modes** added here (figure 9 prints the other four): the route ignores ``status=``,
  and items without a status; 60 pending, 120 reads a minute, 70 % of jobs completed and 10 % each
  failed, canceled, expired: every job once with the status Sume reports, p95 detection delay vs
  chains only on the same jobs.
* **Bursts**: 500 jobs submitted at 12:00 against 10,000 reads a day (nothing read earlier that
  day), 100 more at 23:00, chains only; the baseline is the same run with the limiter set to space
  the day evenly (the real Budget at 9 a minute, which grants 7 a minute: 10,080 a day, the day's
  10,000 spread over it), stopped at midnight (its delays then are lower bounds).

``BENCH_WEBHOOKS_ONLY=1`` runs only the webhook rows: the capacity of the webhook arm and its target
line, and the reads per job with 30 % lost (figure 9 likewise runs only its webhook row).
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import SCRATCH
from bench.fig_discovery import KINDS, LIST_CAPABLE, Arm, BigResult, JobFacts, arrivals, big_run, p95
from bench.report import Row, info_row, plain, target_row

DAY = 86_400.0
BUDGET = (120, 10_000)  # Sume's documented reads a minute, a day
TICK = 60.0  # SweepPeriodMinutes (template default 1)
SAFETY = 900.0  # SweepSafetySeconds (template default)
SHARE = 0.1  # SweepReadSharePercent (template default 10)
LANE = round(BUDGET[1] * SHARE)  # list reads a day the sweeps' lane keeps
LIMIT = BUDGET[1] - LANE  # the limit: one result read per job, from what sweeps leave
HOOK_LOSS = 0.3

DELAY_MAX = 300.0  # p95 detection delay of a served rate
BACKLOG_X = 1.1
#: Jobs the backlog may also move by: at tens of pending jobs, an eighth of a day's mean count
#: still moves by a few jobs from Poisson noise alone (a backlog that runs away grows by hundreds).
BACKLOG_SLACK = 5
SWEEPS_X, SWEEPS_LIMIT_X, HOOKS_LIMIT_X = 2.5, 0.8, 0.8  # capacity targets

LONG_PENDING, LONG_MEDIAN, LONG_SIGMA = 1_000, 4 * 3_600.0, 0.3
LONG_TICK = 300.0
LONG_DELAY_X, LONG_READS = 2.0, 1.3
HOOK_READS = 1.4

MISS_PENDING, MISS_X = 60, 1.5
MISS_MODES: dict[str, dict[str, Any]] = {
    "status filter ignored": {"status_filter": "ignored"},
    "items without status": {"item_status": False},
}
OUTCOMES = (("completed", 0.7), ("failed", 0.1), ("canceled", 0.1), ("expired", 0.1))

BURST, BURST_AT, LATE, LATE_AT = 500, 12 * 3_600.0, 100, 23 * 3_600.0
EVEN_MINUTE = 9  # the Budget's grants at 9 a minute: 7 (limits below 20 keep 2 back)
BURST_X = 0.3

def webhooks_only() -> bool:
    return os.environ.get("BENCH_WEBHOOKS_ONLY") == "1"


ARMS = {
    "chains only": Arm(10**9, False, budget=BUDGET),
    "chains + sweeps": Arm(10**9, True, budget=BUDGET),
    f"chains + webhooks {HOOK_LOSS:.0%} lost": Arm(10**9, False, budget=BUDGET, webhook_loss=HOOK_LOSS),
}


# -- capacity -----------------------------------------------------------------------------------------

@dataclass
class Probe:
    """One arm at one arrival rate over one (simulated) day."""

    rate: float  # jobs a day
    result: BigResult
    day: float
    wall: float

    @property
    def p95(self) -> float:
        return p95(self.result.delays)

    def pending_over(self, mark: float) -> float:
        """Mean pending count at the ticks of the eighth of the day up to ``mark`` (clock offset)."""
        r = self.result
        got = [n for at, n in zip(r.tick_at, r.pending, strict=True) if mark - self.day / 8 < at <= mark]
        return sum(got) / len(got) if got else math.inf

    @property
    def backlog(self) -> tuple[float, float]:
        return self.pending_over(self.day / 4), self.pending_over(self.day)

    @property
    def bounded(self) -> bool:
        quarter, end = self.backlog
        return not self.result.aborted and end <= BACKLOG_X * quarter + BACKLOG_SLACK

    @property
    def fast(self) -> bool:
        return self.p95 <= DELAY_MAX

    @property
    def once(self) -> bool:
        r = self.result
        return not r.twice and not r.wrong_status and (r.aborted or r.never_recorded == r.in_flight)

    @property
    def served(self) -> bool:
        return self.bounded and self.fast

    def describe(self) -> str:
        r = self.result
        quarter, end = self.backlog
        return (f"{self.rate:,.0f}/day: p95 delay {self.p95:.0f} s, pending {quarter:.0f} -> "
                + ("run away (stopped)" if r.aborted else f"{end:.0f}")
                + f", reads {r.status_reads}+{r.result_reads}+{r.list_reads} (status+result+list)")


def _stop(day: float) -> Callable[[BigResult], bool]:
    """A probe whose backlog ran away: pending over 4x the quarter mark's and 40 more."""
    def stop(r: BigResult) -> bool:
        if not r.tick_at or r.tick_at[-1] <= day / 4:
            return r.pending[-1] > 3_000 if r.pending else False
        quarter = [n for at, n in zip(r.tick_at, r.pending, strict=True) if day / 8 < at <= day / 4]
        return r.pending[-1] > 4 * (sum(quarter) / max(1, len(quarter))) + 40
    return stop


class Capacity:
    """Probes of one arm, kept by rate (a bisection and its backlog-only twin share them)."""

    def __init__(self, redis_url: str, name: str, day: float, seed: int) -> None:
        self.redis_url, self.name, self.arm, self.day, self.seed = redis_url, name, ARMS[name], day, seed
        self.probes: dict[int, Probe] = {}

    def probe(self, rate: float) -> Probe:
        key = round(rate)
        if key not in self.probes:
            started = time.monotonic()
            line = BUDGET[1] - (LANE if self.arm.sweeps else 0)  # the sweeps' lane is not the line's
            result = big_run(self.redis_url, self.arm, warmup=0.0, measure=self.day, seed=self.seed, drain=7_200.0,
                             plan=arrivals(key / DAY, self.day, self.seed), day_at=DAY - self.day,
                             spent=round(line * (DAY - self.day) / DAY), stop=_stop(self.day))
            self.probes[key] = Probe(key, result, self.day, time.monotonic() - started)
        return self.probes[key]

    def bisect(self, ok: Callable[[Probe], bool], guess: float, precision: float, floor: float = 100.0,
               ceiling: float = 40_000.0) -> tuple[float | None, float | None]:
        """(the largest rate probed that is ``ok``, the smallest that is not), their ratio within
        ``1 + precision``; None where the floor or the ceiling was reached first."""
        lo: float | None = None
        hi: float | None = None
        rate = guess
        while lo is None or hi is None:
            if ok(self.probe(rate)):
                lo = rate
                if hi is None and (rate := rate * 2) > ceiling:
                    break
            else:
                hi = rate
                if lo is None and (rate := rate / 2) < floor:
                    break
        while lo is not None and hi is not None and hi / lo > 1 + precision:
            mid = round(math.sqrt(lo * hi))
            if ok(self.probe(mid)):
                lo = mid
            else:
                hi = mid
        return lo, hi

    def best(self, ok: Callable[[Probe], bool]) -> Probe | None:
        passing = [p for p in self.probes.values() if ok(p)]
        return max(passing, key=lambda p: p.rate) if passing else None

    @property
    def wall(self) -> float:
        return sum(p.wall for p in self.probes.values())


def _served(c: Capacity, precision: float, guess: float) -> tuple[float, str]:
    """(capacity, how it was found) - the rate served, else the backlog-only rate."""
    lo, hi = c.bisect(lambda p: p.served, guess, precision)
    if lo is not None:
        return lo, f"{lo:,.0f} served, {hi:,.0f} not" if hi else f"{lo:,.0f} served (ceiling)"
    lo_b, hi_b = c.bisect(lambda p: p.bounded, guess, precision)
    return 0.0, (f"no rate down to {hi:,.0f}/day keeps p95 <= {DELAY_MAX:.0f} s; backlog only: "
                 + (f"{lo_b:,.0f} bounded, {hi_b:,.0f} not" if lo_b else f"not even {hi_b:,.0f}"))


def _backlog_only(c: Capacity) -> float:
    best = c.best(lambda p: p.bounded)
    return best.rate if best else 0.0


def _where(c: Capacity, at: Probe | None) -> str:
    """Where the reads and the delay go in one probe."""
    if at is None:
        return "no probe"
    from sume_poller.discovery.coverage import is_canary

    r = at.result
    by: dict[str, list[JobFacts]] = {}
    for job_id, j in r.jobs.items():
        if j.recorded:
            by.setdefault(("canary, " if is_canary(job_id) else "") + f"found by {j.found_by}", []).append(j)
    per = "; ".join(f"{k} {len(v)}: status reads/job {sum(j.status_reads for j in v) / len(v):.2f}, p95 delay "
                    f"{p95([j.delay for j in v]):.0f} s" for k, v in sorted(by.items()))
    ticks = len(r.pending)
    sweeps = (f"; sweeps ran {r.sweeps_ran} of {ticks} ticks ({dict(r.sweep_why_not)}), coverage let chains stretch at "
              f"{r.coverage_healthy} of {ticks} ticks" if c.arm.sweeps else "")
    hooks = f"; webhook answers {dict(r.hooks)}" if c.arm.webhook_loss is not None else ""
    return f"at {at.rate:,.0f}/day: {per}; poll outcomes {dict(r.outcomes)}{sweeps}{hooks}"


def _capacity_rows(redis_url: str, quick: bool, seed: int) -> list[Row]:
    day = DAY / 4 if quick else DAY
    precision = 0.025
    guesses = {"chains only": 800.0, "chains + sweeps": 1_600.0, f"chains + webhooks {HOOK_LOSS:.0%} lost": 1_600.0}
    names = [name for name in ARMS if "webhooks" in name or not webhooks_only()]
    caps = {name: Capacity(redis_url, name, day, seed) for name in names}
    found = {name: _served(c, precision, guesses[name]) for name, c in caps.items()}
    hooks = found[f"chains + webhooks {HOOK_LOSS:.0%} lost"][0]
    once = all(p.once for c in caps.values() for p in c.probes.values())
    said = "every job of every probe recorded once, with Sume's status" if once else "A JOB RECORDED TWICE, LOST, WRONG"
    how_day = ("--quick: each probe simulates the last 6 hours of a day (4x shorter than a full day), the limiter "
               "told that an even 18 hours spent three quarters of the day (its day_used); the figure holds because "
               "the day is a total: a steady stream has the same reads a second either way (a quarter of the budget "
               "over a quarter of the day) and meets the same end-of-day reserve" if quick else
               "a whole day from 00:00, the budget fresh")
    rows: list[Row] = []
    for name, (value, how), c in zip(names, found.values(), caps.values(), strict=True):
        row = info_row(f"10 capacity: {name}, jobs a day one key serves (p95 delay <= {DELAY_MAX / 60:.0f} min, "
                       "backlog bounded)", f"{value:,.0f} jobs/day ({how})", f"limit {LIMIT:,} jobs/day (analytic)",
                       value / LIMIT)
        row.lines.append(f"capacity {name}: {value:.0f} jobs/day (backlog only: {_backlog_only(c):.0f})")
        row.notes.append(f"{how_day}; {BUDGET[0]}/min, {BUDGET[1]:,}/day; probes: "
                         + "; ".join(p.describe() for p in sorted(c.probes.values(), key=lambda p: p.rate))
                         + f"; {len(c.probes)} probes, {c.wall:.0f} s real")
        best = c.best(lambda p: p.served) or c.best(lambda p: p.bounded)
        above = [p for p in c.probes.values() if not p.served and (best is None or p.rate > best.rate)]
        over = min(above, key=lambda p: p.rate) if above else None
        # Where sweeps run at all (pending >= 5 per list read), half the limit shows what they do there.
        busy = c.probe(LIMIT / 2) if c.arm.sweeps else None
        row.notes.append(f"where the reads and the delay go, {name}: " + "; ".join(
            _where(c, p) for p in (best, over, busy) if p is not None))
        rows.append(row)
    rows[-1].lines.append(f"capacity limit: {LIMIT:.0f} jobs/day (analytic: {BUDGET[1]:,} a day less the sweeps' "
                          f"lane {LANE:,}, one result read per job)")
    if len(names) == len(ARMS):
        rows += _sweeps_targets(found, once)
    rows.append(target_row("capacity", "webhooks/limit", hooks / LIMIT, ">=", HOOKS_LIMIT_X,
                           f"chains + webhooks ({HOOK_LOSS:.0%} lost) {hooks:,.0f} jobs/day",
                           f"limit {LIMIT:,} (analytic)", ok=once, figure="10 capacity: chains + webhooks / the limit"))
    backlog = [_backlog_only(c) for c in caps.values()]
    rows[-1].notes.append(f"{said}; on the backlog alone: " + (
        f"sweeps/chains {backlog[1] / max(1.0, backlog[0]):.2f}, sweeps/limit {backlog[1] / LIMIT:.2f}, "
        if len(names) == len(ARMS) else "") + f"webhooks/limit {backlog[-1] / LIMIT:.2f}")
    return rows


def _sweeps_targets(found: dict[str, tuple[float, str]], once: bool) -> list[Row]:
    chains, sweeps = found["chains only"][0], found["chains + sweeps"][0]
    rows: list[Row] = []
    base_s = max(chains, 1.0)
    rows.append(target_row("capacity", "sweeps/chains", sweeps / base_s, ">=", SWEEPS_X,
                           f"chains + sweeps {sweeps:,.0f} jobs/day", f"chains only {chains:,.0f}", ok=once,
                           figure="10 capacity: chains + sweeps / chains only"))
    rows.append(target_row("capacity", "sweeps/limit", sweeps / LIMIT, ">=", SWEEPS_LIMIT_X,
                           f"chains + sweeps {sweeps:,.0f} jobs/day", f"limit {LIMIT:,} (analytic)", ok=once,
                           figure="10 capacity: chains + sweeps / the limit"))
    return rows


# -- 1,000 pending long jobs ------------------------------------------------------------------------------

def _long_plan(span: float, seed: int) -> list[tuple[Any, ...]]:
    """The batch in its steady state: ``LONG_PENDING`` jobs already submitted (a running batch's
    ages: durations length-biased, ages uniform within them), then a Poisson stream that keeps it
    pending; queued until done (one phase)."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    mu = math.log(LONG_MEDIAN)
    plan: list[tuple[Any, ...]] = []
    for _ in range(LONG_PENDING):
        duration = math.exp(mu + LONG_SIGMA**2 + LONG_SIGMA * rng.gauss(0.0, 1.0))
        plan.append((0.0, rng.choice(kinds), round(duration, 1), {"age": rng.uniform(0.0, duration), "steps": 1}))
    rate = LONG_PENDING / (LONG_MEDIAN * math.exp(LONG_SIGMA**2 / 2))
    t = 0.0
    while (t := t + rng.expovariate(rate)) < span:
        plan.append((t, rng.choice(kinds), round(math.exp(mu + LONG_SIGMA * rng.gauss(0.0, 1.0)), 1), {"steps": 1}))
    return plan


def _long_rows(redis_url: str, quick: bool, seed: int) -> list[Row]:
    warmup, window = (3_600.0, 7_200.0) if quick else (7_200.0, 21_600.0)
    plan = _long_plan(warmup + window, seed)
    runs = {}
    for sweeps in (False, True):
        arm = Arm(LONG_PENDING, sweeps, tick=LONG_TICK, budget=BUDGET)
        runs[sweeps] = big_run(redis_url, arm, warmup=warmup, measure=window, seed=seed, drain=0.0, plan=plan)
    chains, swept = runs[False], runs[True]
    ok = not chains.twice and not swept.twice and not chains.wrong_status and not swept.wrong_status
    interval = _sweep_interval(swept)
    rows = [
        target_row("discovery", f"long jobs p95 delay/sweep interval {LONG_PENDING} pending",
                   p95(swept.delays) / LONG_TICK, "<=", LONG_DELAY_X,
                   f"{p95(swept.delays):.0f} s / {LONG_TICK:.0f} s sweep period ({len(swept.delays)} jobs Sume "
                   f"finished in the window; sweeps ran every {interval:.0f} s on average)",
                   f"chains only: {p95(chains.delays):.0f} s ({p95(chains.delays) / LONG_TICK:.2f} periods)", ok=ok,
                   figure=f"10 discovery, {LONG_PENDING} pending long jobs (median 4 h): p95 detection delay / sweep "
                          "period"),
        target_row("discovery", f"long jobs reads/finished job with sweeps {LONG_PENDING} pending", swept.per_job, "<=",
                   LONG_READS, swept.describe(), f"chains only: {chains.describe()}", ok=ok,
                   figure=f"10 discovery, {LONG_PENDING} pending long jobs: reads per finished job with sweeps"),
    ]
    rows[1].lines.append(f"discovery long jobs reads/finished job chains only {LONG_PENDING} pending: "
                         f"{plain(chains.per_job)}")
    rows[0].notes.append(
        f"{BUDGET[0]}/min, {BUDGET[1]:,}/day; {warmup / 3_600:.0f} h warm-up, {window / 3_600:.0f} h window "
        f"(--quick: 2 h, full 6 h: the batch starts in its steady state, so the window's length only sets "
        f"the count); completions in the window {swept.finished_in_window} / {chains.finished_in_window} "
        f"(sweeps / chains), {swept.finished_in_window / window * DAY:,.0f} a day; pending at ticks max "
        f"{max(swept.pending)}; found by {dict(swept.found_by)}; sweeps ran {swept.sweeps_ran} times "
        f"({dict(swept.sweep_why_not)}), coverage let chains stretch at {swept.coverage_healthy} of "
        f"{len(swept.pending)} ticks; poll outcomes with sweeps {dict(swept.outcomes)}; runs {chains.wall:.0f} / "
        f"{swept.wall:.0f} s real")
    rows[1].notes.append(f"where the reads go: {_split(swept)} (with sweeps); {_split(chains)} (chains only); "
                         f"p95 detection delay by finder, with sweeps: {_by_finder(swept, warmup, warmup + window)}")
    return rows


def _by_finder(r: BigResult, start: float, end: float) -> str:
    """p95 detection delay of the jobs Sume finished in [start, end), by who found them."""
    by: dict[str, list[float]] = {}
    for j in r.jobs.values():
        if start <= j.done < end:
            by.setdefault(str(j.found_by) if j.recorded else "not recorded", []).append(j.delay)
    return ", ".join(f"{k} {len(v)} jobs {p95(v):.0f} s" for k, v in sorted(by.items()))


def _sweep_interval(r: BigResult) -> float:
    """Clock seconds between sweeps that ran, on average over the run."""
    return r.tick_at[-1] / r.sweeps_ran if r.sweeps_ran and r.tick_at else math.inf


def _split(r: BigResult) -> str:
    f = max(1, r.finished_in_window)
    return (f"status {r.status_reads / f:.2f} + result {r.result_reads / f:.2f} + list {r.list_reads / f:.2f} "
            f"reads per finished job")


# -- webhooks -------------------------------------------------------------------------------------------

def _webhook_rows(redis_url: str, quick: bool, seed: int) -> list[Row]:
    day = DAY / 4 if quick else DAY
    rate = LIMIT / 2
    name = f"chains + webhooks {HOOK_LOSS:.0%} lost"
    line = BUDGET[1]
    r = big_run(redis_url, ARMS[name], warmup=day / 8, measure=day * 7 / 8, seed=seed, drain=7_200.0,
                plan=arrivals(rate / DAY, day, seed), day_at=DAY - day, spent=round(line * (DAY - day) / DAY))
    lost = r.never_recorded - r.in_flight
    ok = not r.twice and not lost and not r.wrong_status
    row = target_row("webhooks", f"{HOOK_LOSS:.0%} lost: reads/finished job", r.per_job, "<=", HOOK_READS,
                     f"{r.describe()}; found by {dict(r.found_by)}", "every completion known for free: 1.00", ok=ok,
                     figure=f"10 webhooks, {HOOK_LOSS:.0%} of deliveries lost, {rate:,.0f} jobs a day: reads per "
                            "finished job")
    from sume_poller.discovery.coverage import is_canary

    groups: dict[str, list[int]] = {}
    for job_id, j in r.jobs.items():
        if j.recorded and day / 8 <= j.done < day:  # Sume finished it in the window
            groups.setdefault(("canary, " if is_canary(job_id) else "") + str(j.found_by), []).append(j.status_reads)
    finished = max(1, sum(len(v) for v in groups.values()))
    status = ", ".join(f"{k} {len(v)} jobs {sum(v) / len(v):.2f} a job ({sum(v) / finished:.2f} of every finished "
                       "job's)" for k, v in sorted(groups.items()))
    row.notes.append(
        f"{_split(r)}; status reads by finder: {status}; "
        f"webhook answers {dict(r.hooks)}; " + ("nothing lost or doubled, every status Sume's own" if ok else
                                                f"TWICE {r.twice}, LOST {lost}, WRONG STATUS {r.wrong_status}")
        + f"; run {r.wall:.0f} s real")
    return [row]


# -- list-miss modes ---------------------------------------------------------------------------------------

def _miss_plan(span: float, seed: int) -> list[tuple[Any, ...]]:
    mean = sum(m * math.exp(s * s / 2) for m, s in KINDS.values()) / len(KINDS)
    rng = random.Random(seed + 1)
    statuses, weights = [s for s, _ in OUTCOMES], [w for _, w in OUTCOMES]
    return [(at, kind, duration, {"outcome": rng.choices(statuses, weights)[0]})
            for at, kind, duration in arrivals(MISS_PENDING / (mean + TICK / 2), span, seed)]


def _miss_rows(redis_url: str, quick: bool, seed: int) -> list[Row]:
    warmup, window = (1_200.0, 1_800.0) if quick else (1_800.0, 3_600.0)
    plan = _miss_plan(warmup + window, seed)
    chains = big_run(redis_url, Arm(MISS_PENDING, False), warmup=warmup, measure=window, seed=seed, plan=plan)
    rows = []
    for name, mode in MISS_MODES.items():
        arm = Arm(MISS_PENDING, True, list_config=tuple({**LIST_CAPABLE, **mode}.items()), label=name)
        swept = big_run(redis_url, arm, warmup=warmup, measure=window, seed=seed, plan=plan)
        bad = {k: sum(getattr(r, k) for r in (chains, swept)) for k in ("twice", "wrong_status")}
        bad["lost"] = sum(r.never_recorded - r.in_flight for r in (chains, swept))
        ok = not any(bad.values())
        row = target_row("discovery", f"miss {name}: p95 delay / chains only", p95(swept.delays) / p95(chains.delays),
                         "<=", MISS_X, f"{swept.describe()}; found by {dict(swept.found_by)}",
                         f"chains only: {chains.describe()}", ok=ok,
                         figure=f"10 discovery, list {name}: p95 detection delay with sweeps / chains only")
        row.notes.append(f"{MISS_PENDING} pending, 120/min, sweeps every {TICK:.0f} s, list {mode}; outcomes "
                         f"{dict(OUTCOMES)}; sweep ticks {dict(swept.sweep_why_not)}; "
                         + ("every job recorded once with the status Sume reports" if ok else f"WRONG: {bad}")
                         + f"; runs {chains.wall:.0f} / {swept.wall:.0f} s real")
        rows.append(row)
    return rows


# -- bursts against the day -------------------------------------------------------------------------------

def _batch(n: int, at: float, rng: random.Random) -> list[tuple[Any, ...]]:
    kinds = list(KINDS)
    out: list[tuple[Any, ...]] = []
    for _ in range(n):
        kind = rng.choice(kinds)
        median, sigma = KINDS[kind]
        out.append((at, kind, round(median * math.exp(sigma * rng.gauss(0.0, 1.0)), 1)))
    return out


def _burst(redis_url: str, per_minute: int, seed: int, *, drain: float) -> tuple[BigResult, list[float], list[float]]:
    """500 jobs at 12:00 and 100 at 23:00 against (``per_minute``, 10,000 a day), chains only; the
    window is the rest of the day (its reads are the day's: nothing read before noon). (the run,
    the first batch's detection delays, the second's; so far where not recorded)."""
    rng = random.Random(seed)
    plan = _batch(BURST, 0.0, rng) + _batch(LATE, LATE_AT - BURST_AT, rng)
    r = big_run(redis_url, Arm(10**9, False, budget=(per_minute, BUDGET[1])), warmup=0.0, measure=DAY - BURST_AT,
                seed=seed, drain=drain, plan=plan, day_at=BURST_AT)
    first = [j.delay for j in r.jobs.values() if j.arrived < LATE_AT - BURST_AT]
    late = [j.delay for j in r.jobs.values() if j.arrived >= LATE_AT - BURST_AT]
    return r, first, late


def _burst_rows(redis_url: str, quick: bool, seed: int) -> list[Row]:
    paced, first, late = _burst(redis_url, BUDGET[0], seed, drain=7_200.0)
    even, even_first, _ = _burst(redis_url, EVEN_MINUTE, seed, drain=0.0)
    ok = not paced.twice and not paced.wrong_status and paced.never_recorded == paced.in_flight

    def unrecorded(r: BigResult, late_batch: bool) -> int:
        return sum(1 for j in r.jobs.values() if not j.recorded and (j.arrived >= LATE_AT - BURST_AT) == late_batch)

    rows = [
        target_row("burst", f"{BURST} jobs at 12:00 p95 delay / even pacing", p95(first) / p95(even_first), "<=",
                   BURST_X, f"p95 detection delay {p95(first):.0f} s (median {_median(first):.0f} s, max "
                   f"{max(first):.0f} s)", f"the day spaced evenly ({EVEN_MINUTE}/min: 7 granted a minute): p95 "
                   f"{p95(even_first):.0f} s (median {_median(even_first):.0f} s; {unrecorded(even, False)} of {BURST} "
                   "not recorded by midnight: their delay so far, a lower bound)", ok=ok,
                   figure=f"10 burst: {BURST} jobs at 12:00 against {BUDGET[1]:,} reads a day, p95 detection delay / "
                          "the day spaced evenly"),
        target_row("burst", "reads in the day / budget", paced.reads / BUDGET[1], "<=", 1.0,
                   f"{paced.reads:,} reads from 12:00 to midnight ({paced.status_reads:,} status, "
                   f"{paced.result_reads:,} result), {paced.rate_limited} of them refused (429)",
                   f"the day's budget {BUDGET[1]:,}", ok=ok,
                   figure="10 burst: Sume reads in the day (served and refused) / the day budget"),
        target_row("burst", f"{LATE} jobs at 23:00 p95 delay / safety cadence", p95(late) / SAFETY, "<=", 1.0,
                   f"p95 detection delay {p95(late):.0f} s (max {max(late):.0f} s; {unrecorded(paced, True)} not "
                   "recorded)", f"the safety cadence {SAFETY:.0f} s (the reserve: one read per pending job per "
                   f"{SAFETY:.0f} s)", ok=ok,
                   figure=f"10 burst: {LATE} more jobs at 23:00, p95 detection delay / the safety cadence"),
    ]
    rows[0].notes.append(f"chains only, {BUDGET[0]}/min; poll outcomes {dict(paced.outcomes)}; even pacing: "
                         f"{even.reads:,} reads by midnight; runs {paced.wall:.0f} / {even.wall:.0f} s real"
                         + ("" if ok else f"; TWICE {paced.twice}, WRONG {paced.wrong_status}, LOST "
                                          f"{paced.never_recorded - paced.in_flight}"))
    return rows


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else math.nan


# -- the figure ---------------------------------------------------------------------------------------------

def measure(quick: bool = False, seed: int = 7) -> list[Row]:
    from bench.harness import layer_logs_to
    from tools.services import RedisServer

    rows: list[Row] = []
    timings: list[str] = []
    with layer_logs_to(SCRATCH / "bench-capacity.log"), RedisServer() as server:
        for name, part in (("capacity", _capacity_rows), ("long jobs", _long_rows), ("webhooks", _webhook_rows),
                           ("list misses", _miss_rows), ("bursts", _burst_rows)):
            if webhooks_only() and name not in ("capacity", "webhooks"):
                continue
            started = time.monotonic()
            rows += part(server.url, quick, seed)
            timings.append(f"{name} {time.monotonic() - started:.0f} s")
    rows[0].notes.append("real time per part: " + ", ".join(timings))
    return rows
