"""Figure 1: read amplification - Sume status reads per job / the simulator's schedule minimum.

Each scenario runs twice on the same job plan: with the real Redis lease, and with the lease
disabled (:class:`bench.harness.NoLease`). Real parts: the batch handler and Poller, Redis,
DynamoDB (moto server), the Sume simulator over HTTP (hints on). The poll queue and the event
source are played in-process (:class:`bench.harness.MemQueue`); see that module for why.

The simulator's ``min_reads`` per job is 1 + the phase changes still ahead at the job's first
status read, i.e. what a client obeying every hint exactly needs from its first read on.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.harness import CountingJobStore, EventSource, MemQueue, NoLease, ObservingSume, SourceStats
from bench.report import Row
from bench.services import Services

DEADLINE_AT = 4_102_444_800
TARGET = 1.02
LAG_NOTE = ("ratio = Sume status reads / the simulator's minimum (1 + phase changes ahead at each job's first read, "
            "hints obeyed exactly); below 1 when reads come later than the hints allow (event source lag: fewer "
            "phases seen). 'redundant reads' (a read seeing the same status as the job's previous read: it learnt "
            "nothing) does not depend on lag.")
KINDS = ["image", "image", "image", "video", "face_swap", "reference_analysis", "ad_video"]
OUTCOMES = ["completed"] * 8 + ["failed", "canceled"]


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    duplicate: bool = False
    fanout: bool = False
    crash_rate: float = 0.0
    #: (LEASE_MARGIN_SECONDS, CLAIM_TTL_SECONDS) for this scenario.
    lease_seconds: tuple[int, int] = (30, 60)


def _production_lease_seconds() -> tuple[int, int]:
    from sume_poller.config import Settings
    defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
    return int(defaults["lease_margin_seconds"]), int(defaults["claim_ttl_seconds"])


def scenarios(fanout_every: float, crash_rate: float, crash_lease_seconds: int) -> list[Scenario]:
    production = _production_lease_seconds()
    short = (crash_lease_seconds, crash_lease_seconds)
    return [
        Scenario("a", "1a Read amplification: every SQS message delivered twice", duplicate=True,
                 lease_seconds=production),
        Scenario("b", f"1b Read amplification: fan-out every {fanout_every:g} s over live chains", fanout=True,
                 lease_seconds=production),
        Scenario("c", f"1c Read amplification: {crash_rate:.0%} of poll invocations crash at a random step "
                      f"(fan-out every {fanout_every:g} s)", fanout=True, crash_rate=crash_rate, lease_seconds=short),
    ]


def plan(n: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """(kind, simulator directives) per job: 2-8 s long, 1-3 phases, mostly completed."""
    rng = random.Random(seed)
    return [(rng.choice(KINDS), {"duration": round(rng.uniform(2.0, 8.0), 2), "steps": rng.choice([1, 2, 2, 3]),
                                 "outcome": rng.choice(OUTCOMES)}) for _ in range(n)]


@dataclass
class RunResult:
    jobs: int
    reads: int = 0
    min_reads: int = 0
    result_reads: int = 0
    over: int = 0
    redundant: int = 0
    #: Jobs recorded with another status than the simulator was told to end them with.
    wrong_status: int = 0
    wall: float = 0.0
    wins_not_one: int = 0
    events_missing: int = 0
    source: SourceStats = field(default_factory=SourceStats)
    lag: tuple[float, float, float] = (0.0, 0.0, 0.0)
    outcomes: Counter[str] = field(default_factory=Counter)
    error: str | None = None

    @property
    def amplification(self) -> float:
        return self.reads / self.min_reads if self.min_reads else float("nan")


def run_once(svc: Services, scenario: Scenario, *, lease_on: bool, jobs: list[tuple[str, dict[str, Any]]],
             fanout_every: float, seed: int, timeout: float, arrival_rate: float, concurrency: int) -> RunResult:
    from sume_poller import runtime
    from sume_poller.fanout import run_fanout
    from sume_poller.messages import PollMessage
    from sume_poller.observability import metrics
    from sume_poller.poller import OUTCOME_TOTALS, Poller

    svc.fresh()
    margin, claim_ttl = scenario.lease_seconds
    settings = dataclasses.replace(runtime.settings(), lease_margin_seconds=margin, claim_ttl_seconds=claim_ttl)
    lease: Any = runtime.lease_store() if lease_on else NoLease(settings.lease_key_prefix)
    store = CountingJobStore(settings.jobs_table)
    bus = svc.bus()
    queue = MemQueue(visibility_timeout=180.0)  # the template's PollQueue VisibilityTimeout
    sume = ObservingSume(runtime.sume_client())

    def make_poller(checkpoint: Any) -> Poller:
        return Poller(settings, lease, sume, store, queue, bus, checkpoint=checkpoint)  # type: ignore[arg-type]

    def fanout() -> Any:
        return run_fanout(settings, store, queue, lease, lambda: 60_000)  # type: ignore[arg-type]

    tag = f"{scenario.key}{'L' if lease_on else 'N'}{random.Random().getrandbits(24):06x}"
    ids = [f"job_{tag}_{i:04d}" for i in range(len(jobs))]
    _warm_up(svc, make_poller(None), tag, settings.pending_shards, store)
    store.wins.clear()
    before = Counter(OUTCOME_TOTALS)
    result = RunResult(jobs=len(jobs))
    started = time.monotonic()
    fed = 0

    def feeder() -> float | None:
        """Jobs arrive at ``arrival_rate`` per second, as submit makes them: created in Sume, recorded
        pending, first poll queued (without submit's first delay)."""
        nonlocal fed
        now = time.monotonic()
        due = min(len(ids), int((now - started) * arrival_rate) + 1)
        while fed < due:
            kind, spec = jobs[fed]
            svc.sim.seed_job(kind, spec, job_id=ids[fed])
            store.put_pending(ids[fed], kind, DEADLINE_AT, settings.pending_shards)
            queue.send(PollMessage(job_id=ids[fed], kind=kind, deadline_at=DEADLINE_AT,
                                   due_at=round(time.time(), 3)).to_json(), 0)
            fed += 1
        return None if fed >= len(ids) else max(0.0, started + fed / arrival_rate - now)

    source = EventSource(queue, make_poller, duplicate=scenario.duplicate, crash_rate=scenario.crash_rate,
                         fanout=fanout if scenario.fanout else None,
                         fanout_every=fanout_every if scenario.fanout else None,
                         rng=random.Random(seed), after_batch=metrics.clear_metrics, feeder=feeder,
                         concurrency=concurrency)
    result.source = source.stats
    try:
        source.run_until(lambda: store.done() >= len(ids), timeout=timeout)
        result.wall = time.monotonic() - started
        source.drain(timeout=60.0)
    except TimeoutError as exc:
        result.error = f"{exc} ({store.done()}/{len(ids)} terminal)"
        result.wall = time.monotonic() - started
    result.lag = queue.lag()
    per_job = svc.sim.stats()["jobs"]
    for job_id in ids:
        s = per_job[job_id]
        result.reads += s["status_reads"]
        result.min_reads += s["min_reads"]
        result.result_reads += s["result_reads"]
        result.over += s["status_reads"] > s["min_reads"]
    result.redundant = sum(sume.redundant[j] for j in ids)
    expected = {"completed": "completed", "failed": "failed", "canceled": "canceled"}
    records = svc.system.jobs(ids)
    result.wrong_status = sum(1 for j, (_kind, spec) in zip(ids, jobs, strict=True)
                              if records.get(j, {}).get("status") != expected[spec["outcome"]])
    result.wins_not_one = sum(1 for j in ids if store.wins[j] != 1)
    result.events_missing = sum(1 for j in ids if bus.events[j] < 1)
    result.outcomes = Counter(OUTCOME_TOTALS)
    result.outcomes.subtract(before)
    return result


def _warm_up(svc: Services, poller: Any, tag: str, shards: int, store: CountingJobStore) -> None:
    """One poll of a throwaway job first: clients built, API key fetched, connections open (that
    is cold start, figure 4, not read amplification)."""
    from sume_poller.messages import PollMessage

    job_id = f"job_warm_{tag}"
    store.put_pending(job_id, "image", DEADLINE_AT, shards)
    svc.sim.seed_job("image", {"duration": 0}, job_id=job_id)
    poller.process(PollMessage(job_id=job_id, kind="image", deadline_at=DEADLINE_AT, due_at=0.0))


def _describe(r: RunResult) -> str:
    return (f"{r.amplification:.3f} ({r.reads} reads / {r.min_reads} min, {r.jobs} jobs); {r.redundant} redundant "
            f"reads, {r.over} jobs over min")


def measure(svc: Services, *, n: int, seed: int, fanout_every: float, crash_rate: float,
            timeout: float, arrival_rate: float = 20.0, crash_lease_seconds: int = 5, concurrency: int = 3,
            only: str = "abc") -> list[Row]:
    rows = []
    jobs = plan(n, seed)
    for scenario in scenarios(fanout_every, crash_rate, crash_lease_seconds):
        if scenario.key not in only:
            continue
        lease, base = (run_once(svc, scenario, lease_on=on, jobs=jobs, fanout_every=fanout_every, seed=seed,
                                timeout=timeout, arrival_rate=arrival_rate, concurrency=concurrency)
                      for on in (True, False))
        exactly_once = lease.wins_not_one == 0
        ok = lease.error is None and base.error is None and exactly_once and lease.wrong_status == 0
        row = Row(scenario.title, _describe(lease), "no lease: " + _describe(base), lease.amplification,
                  f"<= {TARGET}", ok and lease.amplification <= TARGET)
        s, b = lease.source, base.source
        extra = []
        if scenario.duplicate:
            extra.append(f"{s.duplicates} duplicate deliveries (half in the same batch, half 0-2 s later)")
        if scenario.fanout:
            extra.append(f"{s.fanouts} fan-out ticks sent {s.fanout_sent} messages (no lease: {b.fanouts} ticks, "
                         f"{b.fanout_sent} messages)")
        if scenario.crash_rate:
            crashed = sum(s.crashes.values())
            steps = ", ".join(f"{k} {v}" for k, v in sorted(s.crashes.items())) or "none"
            extra.append(f"{crashed} of {s.invocations} invocations crashed ({steps}; {s.crash_planned} planned, "
                         f"a planned step not reached in its batch does not crash); no lease: "
                         f"{sum(b.crashes.values())} of {b.invocations}")
        margin, claim_ttl = scenario.lease_seconds
        extra.append(f"lease margin {margin} s, claim TTL {claim_ttl} s; jobs arriving at {arrival_rate:g}/s, "
                     f"{concurrency} concurrent invocations; event "
                     "source lag past due time p50/p95/max: " + " / ".join(f"{x:.2f}" for x in lease.lag) +
                     " s (no lease: " + " / ".join(f"{x:.2f}" for x in base.lag) + " s)")
        lease_outcomes = ", ".join(f"{k} {v}" for k, v in sorted(lease.outcomes.items()) if v)
        extra.append(f"lease run {lease.wall:.1f} s ({lease_outcomes}); no-lease run {base.wall:.1f} s")
        if exactly_once:
            extra.append("exactly once: every job won exactly one terminal write")
        else:
            extra.append(f"EXACTLY-ONCE VIOLATED with the lease: {lease.wins_not_one} jobs without exactly one "
                         "terminal write won")
        if base.wins_not_one:
            extra.append(f"no lease: {base.wins_not_one} jobs won the conditional terminal write more than once - "
                         "moto's conditional UpdateItem is not atomic under concurrent requests (real DynamoDB "
                         "serialises them); with the lease, concurrent terminal writes for one job do not happen")
        if lease.wrong_status or base.wrong_status:
            extra.append(f"JOBS RECORDED WITH THE WRONG STATUS: {lease.wrong_status} (lease), {base.wrong_status} "
                         "(no lease)")
        if lease.events_missing or base.events_missing:
            extra.append(f"jobs without a terminal event after the drain: {lease.events_missing} (lease), "
                         f"{base.events_missing} (no lease)")
        for label, r in (("lease", lease), ("no lease", base)):
            if r.error:
                extra.append(f"{label} run did not finish: {r.error}")
        lease_saves = 1 - lease.reads / base.reads if base.reads else 0.0
        extra.append(f"the lease saved {lease_saves:.0%} of the no-lease run's Sume status reads")
        row.notes.append("; ".join(extra))
        rows.append(row)
    if rows:
        rows[0].notes.insert(0, LAG_NOTE)
    return rows
