"""Figure 9: bulk discovery - Sume reads per finished job with list sweeps vs chains only.

The in-process stack (:class:`tools.stack.inprocess.InProcessStack`: the template's submit, poll,
fan-out and sweep handlers on moto server, a real redis-server, the Sume simulator over HTTP with
a list route that has a cursor, newest-first order and full items) on a compressed clock. Jobs
arrive steadily (Poisson) in the learned schedule's mix - image (median 20 s, sigma 0.4), video
(6 min, 0.6), ad video (12 min, 0.5), all completed, no hints - at the rate that keeps the wanted
number pending (Little's law on the mix's mean duration plus a minute). The bench plays Lambda's
SQS event source and the two schedules, every 60 clock seconds (``rate(1 minute)`` at scale 1):
fan-out always, the sweep function only in the "sweeps" arm. Both arms run on one stack, reset
in between, with the same arrivals.

Every read Sume served (status, list and result reads together) is counted between two
snapshots after a warm-up; both arms see the same jobs arrive in that window, so the ratio of
their reads is the ratio of their reads per job (reads per job = window reads / arrivals in the
window, steady state). Detection delay = recorded terminal time - the time Sume finished the job,
for the jobs Sume finished in the window (a job not recorded by the end counts with its delay so
far: a lower bound). No job may have two terminal events.

What it shows: with many jobs pending, sweeps find most jobs finished (earlier: a shorter
detection delay), and once they proved coverage of a kind its chains stretch to the safety
cadence (fewer status reads); with few (under 5 pending jobs per list read a sweep costs) sweeps
do not run at all, so reads per job stay those of chains only (the target).

Scale, honestly: the read budget is Sume's 120 a minute without the daily cap (under 10,000 a day
no arrival rate that keeps even 30 of these jobs pending can be served, sweeps or not: every
completed job costs its result read); the pending counts and the clock scale are what moto serves
in real time on 2 cores, with one pending partition (``PendingShards=1``: fan-out's index reads
are the stack's slowest part). SQS delays are whole real seconds, so a chain's read lands up to
1/scale clock seconds late (the event source's lag past due is reported): chains read less often
than on AWS, in both arms alike. Runs of 15-20 minutes of clock time are too short for sweeps to
prove coverage of the long kinds (five of their jobs found finished by chains, then listed), so
the many-pending ratio is informational: the steady state's saving is larger.
"""

from __future__ import annotations

import json
import math
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bench import SCRATCH
from bench.report import Row, info_row, target_row

KINDS = {"image": (20.0, 0.4), "video": (360.0, 0.6), "ad_video": (720.0, 0.5)}
SCALE = 0.02
TICK = 60.0  # clock seconds between schedule ticks
LIST_CAPABLE = {"cursor": True, "order": "newest_first", "fields": "full"}
PARAMETERS = {"ReadsPerMinute": 120, "ReadsPerDay": 0, "CreatesPerMinute": 0, "CreatesPerDay": 0, "Sweeps": "true",
              "PendingShards": 1}
#: Leases that outlast any in-process invocation (the template's minimum claim is above a
#: function's timeout); Sume timeouts to match.
ENV = {"CLAIM_TTL_SECONDS": "10", "LEASE_MARGIN_SECONDS": "5", "START_LEASE_SECONDS": "10",
       "SUME_CONNECT_TIMEOUT": "0.5", "SUME_READ_TIMEOUT": "1"}
MANY, FEW = 30, 10  # pending jobs: above and below the sweeps' cost rule (5 per list read, 4 list reads)
FEW_TARGET = 1.05  # issue 14: where sweeps do not pay, reads per job <= 1.05 x chains only
DRAIN = 2.0  # real seconds after the window for the jobs still running


def mean_sojourn() -> float:
    """Mean clock seconds a job of the mix stays pending: its mean duration plus a minute."""
    return sum(m * math.exp(s * s / 2) for m, s in KINDS.values()) / len(KINDS) + TICK


def arrivals(rate: float, span: float, seed: int) -> list[tuple[float, str, float]]:
    """(clock offset, kind, duration) of a Poisson stream of jobs in the mix."""
    rng = random.Random(seed)
    out: list[tuple[float, str, float]] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= span:
            return out
        kind = rng.choice(list(KINDS))
        median, sigma = KINDS[kind]
        out.append((t, kind, round(median * math.exp(sigma * rng.gauss(0.0, 1.0)), 1)))


@dataclass
class Result:
    pending: int
    sweeps: bool
    jobs: int = 0
    arrived_in_window: int = 0
    reads: int = 0  # in the measurement window: status, list and result reads
    list_reads: int = 0
    delays: list[float] = field(default_factory=list)
    found_by: Counter[str] = field(default_factory=Counter)
    twice: int = 0
    pending_end: int = 0
    max_pending: int = 0
    sweep_ticks: Counter[str] = field(default_factory=Counter)
    stretched: int = 0  # chain steps that read at the safety cadence
    lags: list[float] = field(default_factory=list)  # clock seconds a message was delivered past its due time
    wall: float = 0.0

    @property
    def reads_per_job(self) -> float:
        return self.reads / self.arrived_in_window if self.arrived_in_window else math.nan

    def describe(self) -> str:
        return (f"{self.reads_per_job:.2f} reads/job ({self.reads} reads, {self.list_reads} of them list reads, "
                f"/ {self.arrived_in_window} jobs), p95 detection delay {p95(self.delays):.0f} s")


def p95(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def run(stack: Any, pending: int, sweeps: bool, *, warmup: float, measure: float, drain: float,
        seed: int) -> Result:
    """One arm on a fresh stack state: arrivals for ``warmup + measure`` clock seconds, reads
    counted in [warmup, warmup + measure], then up to ``drain`` real seconds for the rest."""
    from tools.stack.base import scheduled_event

    stack.reset()
    stack.sim.configure(list=LIST_CAPABLE)
    clock, sim = stack.clock, stack.sim
    plan = arrivals(pending / mean_sojourn(), warmup + measure, seed)
    result, ids = Result(pending, sweeps), []
    result.arrived_in_window = sum(1 for at, _, _ in plan if at >= warmup)
    t0 = clock.now()
    next_tick, fed = t0 + TICK, 0
    snapshots: list[tuple[float, int, int]] = []
    started = time.monotonic()
    drain_until: float | None = None

    def counters() -> tuple[float, int, int]:
        stats = sim.stats()
        return clock.now(), stats["status_reads"] + stats["result_reads"] + stats["list_reads"], stats["list_reads"]

    while True:
        now = clock.now() - t0
        while fed < len(plan) and plan[fed][0] <= now:
            _, kind, duration = plan[fed]
            reply = stack.submit({"kind": kind, "params": {"prompt": uuid.uuid4().hex,
                                                           "sim": {"duration": duration, "hints": False}}})
            ids.extend(reply["job_ids"])
            fed += 1
        if len(snapshots) < 2 and now >= warmup + measure * len(snapshots):
            snapshots.append(counters())
        if clock.now() >= next_tick:  # the two schedules
            result.max_pending = max(result.max_pending, stack.fanout().get("pending_counted") or 0)
            if sweeps:
                sweep = stack.invoke("SweepFunction", scheduled_event())
                result.sweep_ticks["ran" if sweep["ran"] else "skipped"] += 1
                result.sweep_ticks["handed over"] += sweep["handed_over"]
            next_tick += TICK
        if len(snapshots) == 2:
            drain_until = drain_until or time.monotonic() + drain
            if time.monotonic() > drain_until or stack.settled(ids):
                break
        messages = stack.receive()  # the SQS event source
        if not messages:
            time.sleep(0.005)
            continue
        now = clock.now()
        result.lags += [now - float(json.loads(m["Body"])["due_at"]) for m in messages]
        stack.deliver(messages)
    result.wall = time.monotonic() - started
    result.stretched = stack.outcomes["stretched"]
    return _collect(stack, result, ids, snapshots)


def _when(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _collect(stack: Any, result: Result, ids: list[str], snapshots: list[tuple[float, int, int]]) -> Result:
    (w0, reads0, list0), (w1, reads1, list1) = snapshots
    result.reads, result.list_reads, result.jobs = reads1 - reads0, list1 - list0, len(ids)
    records = {r["job_id"]: r for r in stack.records(ids)}
    events = Counter(str(e.get("job_id")) for e in stack.events())
    end = stack.clock.now()
    for job_id in ids:
        record = records.get(job_id) or {}
        done_at = _when(stack.sim.job_info(job_id)["terminal_at"])
        terminal = record.get("status") not in (None, "pending")
        if terminal:
            result.found_by[str(record.get("found_by"))] += 1
        else:
            result.pending_end += 1
        if w0 <= done_at < w1:
            result.delays.append((float(record["terminal_at"]) if terminal else end) - done_at)
    result.twice = sum(1 for j in ids if events[j] > 1)
    return result


def _notes(chains: Result, swept: Result) -> str:
    ticks = ", ".join(f"{k} {v}" for k, v in sorted(swept.sweep_ticks.items())) or "none"
    return (f"{swept.jobs} jobs arrived (up to {max(chains.max_pending, swept.max_pending)} pending at a fan-out "
            f"tick); sweep ticks: {ticks}; found by: {dict(swept.found_by)}; {swept.stretched} chain steps "
            f"stretched to the safety cadence; p95 detection delay with sweeps / chains only "
            f"{p95(swept.delays) / p95(chains.delays):.2f}; "
            + ("no job recorded twice" if not chains.twice and not swept.twice else
               f"JOBS RECORDED TWICE: {chains.twice} / {swept.twice}")
            + f"; still pending at the end {chains.pending_end} / {swept.pending_end}; event source lag past due "
            f"p95 {p95(chains.lags):.0f} / {p95(swept.lags):.0f} clock s (SQS's whole real seconds: up to "
            f"{1 / SCALE:.0f}); runs {chains.wall:.0f} / {swept.wall:.0f} s real")


def measure(quick: bool = False, seed: int = 7) -> list[Row]:
    from tools.stack.inprocess import InProcessStack

    window = 360.0 if quick else 600.0
    rows = []
    with InProcessStack(time_scale=SCALE, parameters=PARAMETERS, env=ENV,
                        log_path=SCRATCH / "bench-discovery.log") as stack:
        # Many pending: a warm-up long enough for sweeps to start and prove coverage of the short kinds.
        chains, swept = (run(stack, MANY, sweeps, warmup=window, measure=window, drain=DRAIN, seed=seed)
                         for sweeps in (False, True))
        row = info_row(f"9 discovery reads/job with sweeps / chains only, {MANY} pending (sweeps run)",
                       swept.describe(), f"chains only: {chains.describe()}", swept.reads / chains.reads)
        row.notes.append(_notes(chains, swept))
        rows.append(row)
        # Few pending: sweeps never pay here; the warm-up only fills the pipeline.
        chains, swept = (run(stack, FEW, sweeps, warmup=window / 2, measure=window, drain=DRAIN, seed=seed)
                         for sweeps in (False, True))
        row = target_row("discovery", f"reads/job sweeps/chains {FEW} pending", swept.reads / chains.reads, "<=",
                         FEW_TARGET, f"{swept.describe()}; sweeps ran {swept.sweep_ticks['ran']} times",
                         f"chains only: {chains.describe()}", ok=not chains.twice and not swept.twice,
                         figure=f"9 discovery reads/job with sweeps / chains only, {FEW} pending (sweeps stop: "
                                "under 5 pending jobs per list read)")
        row.notes.append(_notes(chains, swept))
        rows.append(row)
    return rows
