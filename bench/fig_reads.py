"""Figure 1: read amplification - Sume status reads per job / the simulator's minimum, lease vs none.

Each scenario runs twice on the same job plan: with the real Redis lease (the read gate's
claim), and with the lease disabled (:class:`bench.harness.NoLeaseGate`). Real parts: the
submit path (:class:`sume_poller.creates.submit.Submitter`: Sume create, pending record, chain start),
the batch adapter and Poller, fan-out, Redis, DynamoDB (moto server), EventBridge (moto), the
Sume simulator over HTTP (hints on). The poll queue and Lambda's event source are played in
memory (:mod:`bench.harness`, see there why). The read budget is off here (figure 8 has it);
the schedule is the static one with Sume's hints as a lower bound (no learned model).

The simulator's ``min_reads`` per job is 1 + the phase changes still ahead at the job's first
status read: what a client obeying every hint exactly needs from its first read on.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.harness import CountingBus, CountingStore, EventSource, MemQueue, NoLease, NoLeaseGate, make_poller, pacer_of
from bench.report import Row
from bench.services import Services

TARGET = 1.02
KINDS = ["image", "image", "image", "video", "face_swap", "reference_analysis", "ad_video"]
OUTCOMES = ["completed"] * 8 + ["failed", "canceled"]


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    duplicate: bool = False
    fanout: bool = False
    crash_rate: float = 0.0
    #: (margin, claim TTL, start TTL) real seconds; None: production's defaults.
    lease_seconds: tuple[int, int, int] | None = None


def scenarios(fanout_every: float, crash_rate: float, crash_lease: int) -> list[Scenario]:
    return [
        Scenario("a", "1a reads / minimum: every SQS message delivered twice", duplicate=True),
        Scenario("b", f"1b reads / minimum: fan-out every {fanout_every:g} s over live chains", fanout=True),
        Scenario("c", f"1c reads / minimum: {crash_rate:.0%} of poll invocations crash at a random step "
                      f"(fan-out every {fanout_every:g} s)", fanout=True, crash_rate=crash_rate,
                 lease_seconds=(crash_lease, crash_lease, crash_lease)),
    ]


def plan(n: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """(kind, simulator directives) per submission: 2-8 s long, 1-3 phases, mostly completed."""
    rng = random.Random(seed)
    return [(rng.choice(KINDS), {"duration": round(rng.uniform(2.0, 8.0), 2), "steps": rng.choice([1, 2, 2, 3]),
                                 "outcome": rng.choice(OUTCOMES)}) for _ in range(n)]


class ObservingSume:
    """The real SumeClient; counts *redundant* status reads (a read that sees the same status as
    the job's previous read learnt nothing new)."""

    def __init__(self, sume: Any) -> None:
        self._sume = sume
        self._lock = threading.Lock()
        self._last: dict[str, str] = {}
        self.redundant = 0

    def get_status(self, job_id: str, budget: float | None = None) -> Any:
        reply = self._sume.get_status(job_id, budget=budget)
        seen = getattr(reply, "sume_status", None) or getattr(reply, "status", None)
        if seen is not None and type(reply).__name__ in ("Pending", "Terminal"):
            with self._lock:
                self.redundant += self._last.get(job_id) == seen
                self._last[job_id] = seen
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sume, name)


@dataclass
class RunResult:
    jobs: int = 0
    reads: int = 0
    min_reads: int = 0
    redundant: int = 0
    wrong_status: int = 0
    wins_not_one: int = 0
    events_missing: int = 0
    wall: float = 0.0
    lag: tuple[float, float, float] = (0.0, 0.0, 0.0)
    source: Any = None
    error: str | None = None
    outcomes: Counter[str] = field(default_factory=Counter)

    @property
    def ratio(self) -> float:
        return self.reads / self.min_reads if self.min_reads else float("nan")

    def describe(self) -> str:
        return (f"{self.ratio:.3f} ({self.reads} reads / {self.min_reads} min, {self.jobs} jobs; "
                f"{self.redundant} redundant)")


def run_once(svc: Services, sc: Scenario, *, lease_on: bool, submissions: list[tuple[str, dict[str, Any]]],
             fanout_every: float, seed: int, timeout: float, arrival_rate: float, concurrency: int) -> RunResult:
    from sume_poller.config.settings import BudgetSettings, LeaseSettings
    from sume_poller.creates.submit import SubmitSettings, Submitter, one_key
    from sume_poller.limits.budget import Budget
    from sume_poller.limits.lease import LeaseStore
    from sume_poller.limits.pacer import LocalPacer
    from sume_poller.poll.batch import BatchRunner
    from sume_poller.poll.fanout import FanOut, FanOutSettings
    from sume_poller.wiring.shared import reads_budget

    stack = svc.fresh()
    base = svc.settings()
    lease_s = LeaseSettings(*sc.lease_seconds) if sc.lease_seconds else LeaseSettings()
    off = BudgetSettings(0, 0, 0, 0)
    settings = dataclasses.replace(base, lease=lease_s, budget=off)
    clock, prefix, client = settings.common.clock, settings.redis.key_prefix, svc.redis()
    budget = reads_budget(client, prefix, off, settings.common)
    lease: LeaseStore = LeaseStore(client, prefix) if lease_on else NoLease(client, prefix)
    gate = None if lease_on else NoLeaseGate(lease, budget, pacer_of(budget, settings))  # type: ignore[arg-type]
    store = CountingStore(settings.common.jobs_table, settings.jobs.pending_shards)
    bus, queue, sume = CountingBus(settings.event_bus_name), MemQueue(clock), ObservingSume(svc.sume())

    def make_runner() -> BatchRunner:
        poller = make_poller(settings, lease=lease, gate=gate, budget=budget, sume=sume, store=store, bus=bus,
                             queue=queue)
        return BatchRunner(poller, queue, safety_margin_ms=settings.safety_margin_ms)

    fan_settings = dataclasses.replace(FanOutSettings.from_env(os.environ), lease=lease_s, budget=off)
    submit_settings = dataclasses.replace(SubmitSettings.from_env(os.environ), lease=lease_s, budget=off)
    submitter = Submitter(submit_settings, keys=one_key(svc.sume(), Budget(client, f"{prefix}!budget:creates", 0, 0,
                                                                             clock.now), LocalPacer(0, 0, 1)),
                          store=store, queue=queue, lease=lease)
    svc.sume().get_status("job_bench_warm_up")  # the API key fetched, connections open: cold start is figure 4
    run = uuid.uuid4().hex[:8]
    ids: list[str] = []
    fed, started = 0, time.monotonic()

    def feeder() -> float | None:
        """Submissions arrive at ``arrival_rate`` per second through the real submit path."""
        nonlocal fed
        due = min(len(submissions), int((time.monotonic() - started) * arrival_rate) + 1)
        while fed < due:
            kind, spec = submissions[fed]
            reply = submitter.handle({"kind": kind, "params": {"prompt": f"bench {run} #{fed}", "sim": spec}},
                                     lambda: 30_000)
            ids.extend(reply["job_ids"])
            fed += 1
        return None if fed >= len(submissions) else max(0.0, started + fed / arrival_rate - time.monotonic())

    source = EventSource(queue, make_runner, duplicate=sc.duplicate, crash_rate=sc.crash_rate,
                         fanout=(lambda: FanOut(fan_settings, store, queue, lease, budget, lambda: 60_000).run())
                         if sc.fanout else None, fanout_every=fanout_every, feeder=feeder,
                         rng=random.Random(seed), concurrency=concurrency)
    result = RunResult(source=source.stats)
    try:
        source.run(lambda: fed == len(submissions) and store.done() >= len(ids), timeout)
        result.wall = time.monotonic() - started
        source.drain(60.0)
    except TimeoutError as exc:
        result.error = f"{exc} ({store.done()}/{len(ids)} terminal)"
        result.wall = time.monotonic() - started
    result.lag, result.jobs, result.outcomes = queue.lag(), len(ids), source.stats.outcomes
    per_job = stack.sim.stats()["jobs"]
    result.reads = sum(per_job[j]["status_reads"] for j in ids)
    result.min_reads = sum(per_job[j]["min_reads"] for j in ids)
    result.redundant = sume.redundant
    wanted = {j: stack.sim.job_info(j)["terminal_status"] for j in ids}
    records = {r["job_id"]: r for r in stack.records(ids)}
    result.wrong_status = sum(1 for j, status in wanted.items() if records.get(j, {}).get("status") != status)
    result.wins_not_one = sum(1 for j in ids if store.wins[j] != 1)
    result.events_missing = sum(1 for j in ids if bus.events[j] < 1)
    return result


def measure(svc: Services, *, n: int, seed: int, fanout_every: float, crash_rate: float, timeout: float,
            arrival_rate: float, crash_lease: int, concurrency: int, only: str = "abc") -> list[Row]:
    rows = []
    submissions = plan(n, seed)
    for sc in scenarios(fanout_every, crash_rate, crash_lease):
        if sc.key not in only:
            continue
        lease, base = (run_once(svc, sc, lease_on=on, submissions=submissions, fanout_every=fanout_every, seed=seed,
                                timeout=timeout, arrival_rate=arrival_rate, concurrency=concurrency)
                       for on in (True, False))
        ok = lease.error is None and lease.wins_not_one == 0 and lease.wrong_status == 0 and not lease.events_missing
        row = Row(sc.title, lease.describe(), "no lease: " + base.describe(), lease.ratio, f"<= {TARGET}",
                  ok and lease.ratio <= TARGET)
        s, b = lease.source, base.source
        notes = []
        if sc.duplicate:
            notes.append(f"{s.duplicates} duplicate deliveries (half in the same batch, half 0-2 s later); dropped "
                         f"by the lease: {s.outcomes['contention']}")
        if sc.fanout:
            notes.append(f"{s.fanouts} fan-out ticks started {s.fanout_started} chains (no lease: {b.fanouts} ticks, "
                         f"{b.fanout_started} chains)")
        if sc.crash_rate:
            steps = ", ".join(f"{k} {v}" for k, v in sorted(s.crashes.items())) or "none"
            notes.append(f"{sum(s.crashes.values())} of {s.invocations} invocations crashed ({steps}); lease margin, "
                         f"claim and start TTL {sc.lease_seconds[0] if sc.lease_seconds else '-'} s")
        notes.append(f"jobs arriving at {arrival_rate:g}/s through the submit path, {concurrency} concurrent "
                     "invocations; event source lag past due p50/p95/max " + "/".join(f"{x:.2f}" for x in lease.lag)
                     + f" s; runs {lease.wall:.0f} s / {base.wall:.0f} s")
        notes.append("exactly once: every job won one terminal write and has its event" if ok and not lease.error else
                     f"LEASE RUN NOT CLEAN: {lease.wins_not_one} jobs without exactly one terminal write, "
                     f"{lease.wrong_status} with a wrong status, {lease.events_missing} without an event"
                     + (f"; {lease.error}" if lease.error else ""))
        if base.wins_not_one:
            notes.append(f"no lease: {base.wins_not_one} jobs won the conditional terminal write more than once "
                         "(moto's conditional UpdateItem is not atomic under concurrent requests; real DynamoDB is)")
        if base.reads:
            notes.append(f"the lease saved {1 - lease.reads / base.reads:.0%} of the no-lease run's status reads")
        row.notes.append("; ".join(notes))
        rows.append(row)
    return rows
