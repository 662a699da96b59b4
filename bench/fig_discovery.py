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
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from bench import SCRATCH
from bench.report import Row, infeasible_row, info_row, target_row

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
FEW_TARGET = 1.05  # where sweeps do not pay, reads per job <= 1.05 x chains only
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
    from bench.fig_capacity import webhooks_only
    from bench.harness import layer_logs_to
    from tools.services import RedisServer
    from tools.stack.inprocess import InProcessStack

    window = 360.0 if quick else 600.0
    if webhooks_only():  # BENCH_WEBHOOKS_ONLY=1: the webhook row alone
        with layer_logs_to(SCRATCH / "bench-discovery-virtual.log"), RedisServer() as server:
            return _webhook_rows(server.url, quick, seed)
    with layer_logs_to(SCRATCH / "bench-discovery-virtual.log"):
        rows = _big_rows(quick, seed)
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


# -- 1,000 pending on a virtual clock (figure 8's method) -----------------------------------------------

BIG = 1_000  # pending jobs (Little's law on the mix)
BIG_TICK = 300.0  # clock seconds between fan-out/sweep ticks: the sweep interval of the 1,000-pending measure
BIG_BUDGET = (120, 10_000)  # reads a minute, a day
#: p95 detection delay <= 2 sweep intervals (infeasible here: an info line); reads per finished job (a target)
BIG_DELAY_X, BIG_READS = 2.0, 1.3


class _MemoryStore:
    """The job table in memory, with JobStore's semantics for what the poller and sweeper call."""

    results = None

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.pending = 0

    def result_fields(self, job_id: str, result: Any) -> dict[str, Any]:
        return {"result_json": "{}", "result_bytes": 2}

    def put_pending(self, job_id: str, kind: str, *, now: float, deadline_at: int) -> None:
        self.records[job_id] = {"job_id": job_id, "kind": kind, "profile": kind, "status": "pending",
                                "deadline_at": deadline_at, "submitted_at": int(now)}
        self.pending += 1

    def get(self, job_id: str) -> dict[str, Any] | None:
        record = self.records.get(job_id)
        return dict(record) if record else None

    def get_many(self, job_ids: list[str]) -> dict[str, dict[str, Any]]:
        return {j: dict(self.records[j]) for j in job_ids if j in self.records}

    def record_terminal(self, job_id: str, outcome: Any, *, now: float, claim: Any = None) -> Any:
        from sume_poller.store.records import TerminalWrite

        record = self.records.get(job_id)
        if record is None or record["status"] != "pending":
            return TerminalWrite(False, dict(record) if record else None)
        record.update(status=outcome.status, terminal_at=now, event_pending=True, found_by=outcome.found_by,
                      status_reads=outcome.status_reads, result_reads=outcome.result_reads,
                      seen_running_at=outcome.seen_running_at, seen_terminal_at=outcome.seen_terminal_at,
                      has_result="result_json" in outcome.result, evidence=outcome.evidence,
                      **({"event_claim": claim.token, "chain_due_at": claim.until} if claim is not None else {}))
        self.pending -= 1
        return TerminalWrite(True, dict(record))

    def claim_outbox(self, job_id: str, claim: Any, *, now: float) -> Any:
        from bench.harness import take_claim

        return take_claim(self.records.get(job_id), claim, now)

    def release_claim(self, job_id: str, token: str) -> bool:
        from bench.harness import free_claim

        return free_claim(self.records.get(job_id), token)

    def clear_outbox(self, job_id: str, *, now: float) -> bool:
        return self.records[job_id].pop("event_pending", None) is not None

    def put_observation(self, *args: Any, **kwargs: Any) -> None:
        pass

    def fence(self, job_id: str, token: str, seq: int, *, now: float, hold: float) -> Any:
        """JobStore.fence: a step that could not ask Redis (a round trip timed out under a loaded
        machine) reads once, by the record's fence - another chain's step only once the holder's
        hold (``chain_due_at``) has passed."""
        from sume_poller.store.records import TerminalWrite

        record = self.records.get(job_id)
        held = record.get("fence_token") if record else None
        free = held is None or (held == token and record.get("fence_seq", 0) <= seq) or (  # type: ignore[union-attr]
            held != token and record.get("chain_due_at", now) <= now)  # type: ignore[union-attr]
        if record is None or record["status"] != "pending" or not free:
            return TerminalWrite(False, dict(record) if record else None)
        record.update(fence_token=token, fence_seq=seq + 1, chain_due_at=now + hold)
        return TerminalWrite(True, dict(record))

    def set_chain_due(self, job_id: str, due_at: float) -> None:
        record = self.records.get(job_id)
        if record is not None and record["status"] == "pending":
            record["chain_due_at"] = due_at


class _Bus:
    def __init__(self) -> None:
        self.events: Counter[str] = Counter()

    def put_terminal(self, job_id: str, record: dict[str, Any]) -> None:
        self.events[job_id] += 1


@dataclass(frozen=True)
class Arm:
    """One virtual-clock run: how many jobs pending, what finds them, the budget, the list route."""

    pending: int
    sweeps: bool
    tick: float = 60.0  # clock seconds between fan-out/sweep ticks (the sweep interval)
    budget: tuple[int, int] = (120, 0)  # reads a minute, a day
    list_config: tuple[tuple[str, Any], ...] = tuple(LIST_CAPABLE.items())
    webhook_loss: float | None = None  # webhooks on for every kind, this share of deliveries lost
    read_share: float = 0.1  # the sweeps' lane
    duration_x: float = 1.0  # every duration of the mix times this
    label: str = ""
    windows: str = "fixed"  # how the simulator counts its minute and day windows: fixed or sliding


class JobFacts(NamedTuple):
    arrived: float  # clock offset of its arrival in the run
    done: float  # clock offset of Sume finishing it
    delay: float  # detection delay (not recorded: so far, a lower bound)
    recorded: bool
    kind: str
    found_by: str | None
    status_reads: int  # Sume's count, all the job's reads
    result_reads: int


@dataclass
class BigResult:
    sweeps: bool
    arrived: int = 0
    finished_in_window: int = 0
    reads: int = 0
    list_reads: int = 0
    status_reads: int = 0
    result_reads: int = 0
    delays: list[float] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # at each tick
    sweeps_ran: int = 0
    capped: int = 0  # arrivals not submitted: the wanted number was pending
    sweep_why_not: Counter[str] = field(default_factory=Counter)
    handed_over: int = 0
    found_by: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    hooks: Counter[str] = field(default_factory=Counter)  # webhook answers
    twice: int = 0
    never_recorded: int = 0  # jobs still pending here after the drain...
    in_flight: int = 0  # ... of them with their chain's next message still queued (not lost)
    polls: int = 0
    wall: float = 0.0
    tick_at: list[float] = field(default_factory=list)  # clock offset of each entry of ``pending``
    jobs: dict[str, JobFacts] = field(default_factory=dict)  # every job submitted
    rate_limited: int = 0  # in the window: reads Sume refused (429)
    wrong_status: int = 0  # jobs recorded with another status than Sume's own
    coverage_healthy: int = 0  # ticks at which sweeps' coverage let chains stretch (any kind)
    aborted: bool = False  # ``stop`` ended the run early

    @property
    def per_job(self) -> float:
        return self.reads / self.finished_in_window if self.finished_in_window else math.nan

    def describe(self) -> str:
        return (f"{self.per_job:.2f} reads/finished job ({self.reads} reads: {self.status_reads} status, "
                f"{self.result_reads} result, {self.list_reads} list / {self.finished_in_window} finished), "
                f"p95 detection delay {p95(self.delays):.0f} s")


def big_run(redis_url: str, arm: Arm, *, warmup: float, measure: float, seed: int,
            drain: float = 7_200.0, plan: list[tuple[Any, ...]] | None = None, day_at: float = 0.0,
            spent: int = 0, stop: Callable[[BigResult], bool] | None = None, lag: float = 0.0) -> BigResult:
    """Real Poller, Sweeper, WebhookReceiver, Budget and leases on a real redis-server, the
    simulator over HTTP, a virtual clock; the driver plays submit (the record and first message),
    SQS, the schedule's ticks (fan-out's pending count, the sweep function) and Sume's webhook
    sender. After the window, arrivals stop and the run goes on (up to ``drain`` clock seconds)
    until every job is recorded: a job still pending then counts as never recorded.

    ``plan``: the arrivals, (clock offset, kind, duration[, sim directives]) - ``age`` among the
    directives seeds a job created that long before its arrival (default: a Poisson stream that
    keeps ``arm.pending`` pending). ``day_at``: the run starts this many clock seconds into a UTC
    day; ``spent``: reads of that day the limiter counts as spent before the run (its
    ``day_used``, as an earlier part of the day would have left it). ``stop``: asked at each tick,
    True ends the run there (``aborted``; the window's reads are counted up to then). ``lag``: each
    message sent to SQS arrives up to this many clock seconds after its delay (uniformly: SQS's and
    Lambda's own latency, which a compressed clock magnifies); 0: at once."""
    import heapq

    from bench.fig_budget import START, VirtualClock
    from bench.harness import DetachedQueue, make_poller, virtual_poll_settings
    from sume_poller.config.settings import BudgetSettings, DiscoverySettings, ScheduleSettings
    from sume_poller.core.jobs import canonical_terminal_status
    from sume_poller.core.messages import PollMessage, parse_message
    from sume_poller.discovery.coverage import CoverageStore, CoverageView
    from sume_poller.discovery.sweep import Sweeper, SweepSettings
    from sume_poller.discovery.webhook import WebhookReceiver
    from sume_poller.limits.budget import Budget
    from sume_poller.limits.lease import LeaseStore, new_token
    from sume_poller.limits.redisconn import connect
    from sume_poller.poll.step import Deadline
    from sume_poller.store.queue import Outgoing, PollQueue
    from sume_poller.sume.client import SumeClient
    from tools.sume_sim import SumeSimulator

    day = 86_400
    start = START + day_at
    clock = VirtualClock(start)
    key, prefix = "sume_bench_" + uuid.uuid4().hex, f"bench:disc:{uuid.uuid4().hex[:6]}:"
    per_minute, per_day = arm.budget
    heap: list[tuple[float, int, str, Any]] = []
    seq = 0

    def push(at: float, what: str, payload: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (at, seq, what, payload))

    class HeapQueue(PollQueue):  # the sweeper's and the receiver's sends land in the driver's SQS
        def _send_batch(self, chunk: list[Outgoing]) -> set[str]:
            for m in chunk:
                push(clock.t + self.real_delay(m.delay), "msg", m.body)
            return set()

    hooks = arm.webhook_loss is not None
    secret = "whsec_bench_" + uuid.uuid4().hex
    result = BigResult(arm.sweeps)
    late = random.Random(seed + 1)
    with SumeSimulator(api_key=key, hints=False, clock=clock, deliver_webhooks=False,
                       read_budget={"per_minute": per_minute or None, "per_day": per_day or None},
                       budget_windows={"minute": arm.windows, "day": arm.windows},
                       webhooks={"kinds": list(KINDS), "secret": secret, "loss": arm.webhook_loss or 0.0}
                       if hooks else None) as sim:
        sim.configure(list=dict(arm.list_config))
        settings = virtual_poll_settings(
            clock, sume_url=sim.base_url, redis_url=redis_url, prefix=prefix,
            budget=BudgetSettings(per_minute, per_day, 0, 0), max_age=10 * day,
            schedule=ScheduleSettings(learned=False),
            discovery=DiscoverySettings(sweeps=arm.sweeps, webhook_kinds=frozenset(KINDS) if hooks else frozenset()))
        client = connect(settings.redis)
        lease, store, bus = LeaseStore(client, prefix), _MemoryStore(), _Bus()
        budget = Budget(client, f"{prefix}!budget:reads", per_minute, per_day, clock.now, early=0.5)
        if spent:
            client.hset(budget.key, mapping={"day_used": spent, "day_reset": int((START + day) * 1000)})
        coverage = CoverageStore(client, prefix)
        sume = SumeClient(sim.base_url, lambda: key)
        poller = make_poller(settings, lease=lease, budget=budget, sume=sume, store=store, bus=bus,
                             queue=DetachedQueue(clock), share=1,
                             coverage=CoverageView(coverage, clock.now) if arm.sweeps or hooks else None)
        side_queue = HeapQueue("memory://side", clock, sqs=object())
        receiver = WebhookReceiver(clock, secret=lambda: secret, tolerance=300.0, store=store,  # type: ignore[arg-type]
                                   lease=lease, queue=side_queue, handover_ttl_real=600.0, coverage=coverage)
        if plan is None:
            mean = sum(m * math.exp(s * s / 2) for m, s in KINDS.values()) / len(KINDS) * arm.duration_x
            plan = arrivals(arm.pending / (mean + arm.tick / 2), warmup + measure, seed)
        for at, kind, duration, *extra in plan:
            push(start + at, "arrive", (kind, duration * arm.duration_x, extra[0] if extra else {}))
        w0, end = start + warmup, start + warmup + measure
        for n in range(1, int((warmup + measure + drain) // arm.tick) + 1):
            push(start + n * arm.tick, "tick", None)
        push(w0, "snapshot", None)
        push(end, "snapshot", None)
        ids: list[str] = []
        born: dict[str, float] = {}
        snaps: list[dict[str, Any]] = []
        started = time.monotonic()

        def deliver_webhooks(until: float) -> None:
            while (due := sim.model.next_webhook_due()) is not None and due <= until:
                clock.t = max(clock.t, due)
                for delivery in sim.model.take_due_webhooks():
                    answers = [receiver.handle(delivery.headers, delivery.plan.body).status
                               for _ in range(delivery.copies)]
                    result.hooks.update(str(a) for a in answers)
                    sim.model.record_delivery(delivery, answers)  # type: ignore[arg-type]

        while heap and heap[0][0] <= end + drain:
            if hooks:
                deliver_webhooks(heap[0][0])
            at, _, what, payload = heapq.heappop(heap)
            clock.t = max(clock.t, at)
            if what == "arrive":
                kind, duration, directives = payload
                if store.pending >= arm.pending:  # the stream keeps the wanted number pending
                    result.capped += 1
                    continue
                directives = dict(directives)
                age = float(directives.pop("age", 0.0))
                job_id = sim.seed_job(kind, {"duration": duration, "hints": False, **directives}, age=age,
                                      webhook_url="https://hooks.invalid/sume" if hooks else None)
                ids.append(job_id)
                born[job_id] = at - start
                store.put_pending(job_id, kind, now=at - age, deadline_at=int(at) + 10 * day)
                token = new_token()
                lease.start(job_id, token, day * 1000)
                push(at, "msg", PollMessage(job_id=job_id, kind=kind, deadline_at=int(at) + 10 * day, due_at=at,
                                            token=token, seq=0, submitted_at=int(at - age)).to_json())
            elif what == "msg":
                outcome = poller.process(parse_message(payload), Deadline(30.0))
                result.polls += 1
                result.outcomes[outcome.name] += 1
                if outcome.send is not None:
                    push(clock.t + poller.queue.real_delay(outcome.send.delay) + late.uniform(0.0, lag), "msg",
                         outcome.send.body)
            elif what == "tick":
                if clock.t > end and store.pending == 0:
                    break  # drained
                pending = store.pending
                result.pending.append(pending)
                result.tick_at.append(clock.t - start)
                if stop is not None and stop(result):
                    result.aborted = True
                    break
                budget.mailbox.set_pending(pending)  # what fan-out counts and tells the limiter
                if arm.sweeps:
                    report = Sweeper(SweepSettings(arm.tick, read_share=arm.read_share), clock, sume=sume,
                                     store=store, queue=side_queue, lease=lease,  # type: ignore[arg-type]
                                     budget=budget, coverage=coverage,
                                     remaining_ms=lambda: 60_000, handover_ttl_real=600.0).run()
                    result.sweeps_ran += report.ran
                    result.handed_over += report.handed_over
                    why = report.why_not or report.incomplete_reason or "complete"
                    result.sweep_why_not[re.sub(r"[\d.]+", "N", why)] += 1
                    snapshot = coverage.snapshot(clock.t)
                    result.coverage_healthy += any(snapshot.stretches(k, clock.t) for k in snapshot.covered)
            else:
                snaps.append(sim.stats())
        result.wall = time.monotonic() - started
        queued = {json.loads(payload)["job_id"] for _, _, what, payload in heap if what == "msg"}
        while len(snaps) < 2:  # stopped early
            snaps.append(sim.stats())
        (s0, s1) = snaps
        for name in ("status_reads", "result_reads", "list_reads", "rate_limited"):
            setattr(result, name, s1[name] - s0[name])
        result.reads = result.status_reads + result.result_reads + result.list_reads
        result.arrived = len(ids)
        for job_id in ids:
            record = store.records[job_id]
            recorded = record["status"] != "pending"
            if recorded:
                result.found_by[str(record.get("found_by"))] += 1
                if w0 <= record["terminal_at"] < end:
                    result.finished_in_window += 1
            else:
                result.never_recorded += 1
                result.in_flight += job_id in queued
            info = sim.job_info(job_id)
            done_at = _when(info["terminal_at"])
            if recorded and record["status"] != canonical_terminal_status(str(info["status"])):
                result.wrong_status += 1
            delay = (record["terminal_at"] if recorded else clock.t) - done_at
            if w0 <= done_at < end:
                result.delays.append(delay)
            result.jobs[job_id] = JobFacts(born[job_id], done_at - start, delay, recorded, record["kind"],
                                           record.get("found_by"), info["status_reads"], info["result_reads"])
        result.twice = sum(1 for n in bus.events.values() if n > 1)
        client.flushdb()
    return result


def _virtual(redis_url: str, arm: Arm, quick: bool, seed: int, *, long: bool = False) -> BigResult:
    warmup, window = ((1_800.0, 1_800.0) if quick else (2_700.0, 3_600.0)) if long else \
        ((1_200.0, 1_800.0) if quick else (1_800.0, 3_600.0))
    return big_run(redis_url, arm, warmup=warmup, measure=window, seed=seed)


def _once(*results: BigResult) -> tuple[bool, str]:
    """No job recorded twice or lost, in every arm? (ok, what to say). A job still pending after
    the drain with its chain's next message queued is not lost: the budget had no slot for it."""
    twice = sum(r.twice for r in results)
    lost = sum(r.never_recorded - r.in_flight for r in results)
    waiting = " / ".join(str(r.in_flight) for r in results)
    said = f"still pending after the drain, chains alive: {waiting}" if any(r.in_flight for r in results) else \
        "every job recorded"
    if not twice and not lost:
        return True, f"no job recorded twice or lost ({said})"
    return False, f"JOBS RECORDED TWICE: {twice}; LOST (no chain left): {lost}; {said}"


def _big_rows(quick: bool, seed: int) -> list[Row]:
    from tools.services import RedisServer

    with RedisServer() as server:
        rows = _thousand_rows(server.url, quick, seed)
        rows += _miss_rows(server.url, quick, seed)
        rows += _webhook_rows(server.url, quick, seed)
    return rows


def _thousand_rows(redis_url: str, quick: bool, seed: int) -> list[Row]:
    chains, swept = (_virtual(redis_url, Arm(BIG, on, tick=BIG_TICK, budget=BIG_BUDGET), quick, seed, long=True)
                     for on in (False, True))
    ok, once = _once(chains, swept)
    base = f"chains only: {chains.describe()}"
    delay = p95(swept.delays) / BIG_TICK
    mean = sum(m * math.exp(s * s / 2) for m, s in KINDS.values()) / len(KINDS) + BIG_TICK / 2
    need = BIG / mean * 60
    over = need / (BIG_BUDGET[1] / 1440)
    rows = [
        infeasible_row("discovery", f"p95 detection delay / sweep interval {BIG} pending", delay,
                       f"{p95(swept.delays):.0f} s / {BIG_TICK:.0f} s sweep interval, {len(swept.delays)} jobs Sume "
                       f"finished in the window", f"{base} ({p95(chains.delays) / BIG_TICK:.2f} intervals)",
                       f"9 discovery p95 detection delay / sweep interval, {BIG} pending, virtual clock",
                       f"infeasible at {per_day_text()}: {BIG} jobs of this mix pending finish {need:.0f} a minute, "
                       f"each needing its result read, against {BIG_BUDGET[1] / 1440:.1f} reads a minute the day "
                       f"allows ({over:.0f}x over): finished jobs queue for their result reads whatever the policy, "
                       f"so none keeps the p95 within {BIG_DELAY_X:g} sweep intervals", ok=ok),
        target_row("discovery", f"reads/finished job with sweeps {BIG} pending", swept.per_job, "<=", BIG_READS,
                   swept.describe(), base, ok=ok,
                   figure=f"9 discovery reads/finished job with sweeps, {BIG} pending, virtual clock"),
    ]
    rows[0].notes.append(
        f"virtual clock, {per_day_text()}; arrivals not submitted while {BIG} are pending ({chains.capped} / "
        f"{swept.capped}); "
        f"{swept.arrived} jobs submitted; pending at ticks (chains / sweeps) max {max(chains.pending)} / "
        f"{max(swept.pending)}; sweeps ran {swept.sweeps_ran} times, handed over {swept.handed_over}; sweep "
        f"ticks: {dict(swept.sweep_why_not)}; found by {dict(swept.found_by)}; {once}; runs {chains.wall:.0f} / "
        f"{swept.wall:.0f} s real")
    return rows


MISS_PENDING = 60  # pending jobs: sweeps pay (5+ per list read) and 120 reads a minute keep up
MISS_X = 1.5  # each list-miss mode: p95 detection delay <= 1.5x chains only
MISS_MODES: dict[str, dict[str, Any]] = {
    "omits a kind": {"omit_kinds": ["video"]},
    "newest N only": {"newest_n": 3},
    "lags 3 min": {"lag": 180.0},
    "route missing": {"route": "missing"},
}
#: webhooks, 30 % of deliveries lost: one read per job, the floor (an info line: see _webhook_rows)
HOOK_LOSS, HOOK_READS = 0.3, 1.3


def _miss_rows(redis_url: str, quick: bool, seed: int) -> list[Row]:
    chains = _virtual(redis_url, Arm(MISS_PENDING, False), quick, seed)
    rows = []
    for name, mode in MISS_MODES.items():
        arm = Arm(MISS_PENDING, True, list_config=tuple({**LIST_CAPABLE, **mode}.items()), label=name)
        swept = _virtual(redis_url, arm, quick, seed)
        ok, once = _once(chains, swept)
        row = target_row("discovery", f"miss {name}: p95 delay / chains only", p95(swept.delays) / p95(chains.delays),
                         "<=", MISS_X, f"{swept.describe()}; found by {dict(swept.found_by)}",
                         f"chains only: {chains.describe()}", ok=ok,
                         figure=f"9 discovery, list {name}: p95 detection delay with sweeps / chains only")
        row.notes.append(f"{MISS_PENDING} pending, sweeps every {Arm.tick:.0f} clock s, list {mode}; sweep ticks: "
                         f"{dict(swept.sweep_why_not)}; {once}; runs {chains.wall:.0f} / {swept.wall:.0f} s real")
        rows.append(row)
    return rows


def _webhook_rows(redis_url: str, quick: bool, seed: int) -> list[Row]:
    hooked = _virtual(redis_url, Arm(MISS_PENDING, False, webhook_loss=HOOK_LOSS), quick, seed)
    chains = _virtual(redis_url, Arm(MISS_PENDING, False), quick, seed)
    ok, once = _once(hooked)
    row = infeasible_row(
        "discovery", f"webhooks {HOOK_LOSS:.0%} lost: reads/finished job", hooked.per_job,
        f"{hooked.describe()}; found by {dict(hooked.found_by)}", f"chains only: {chains.describe()}",
        f"9 discovery, webhooks with {HOOK_LOSS:.0%} of deliveries lost: reads per finished job",
        f"infeasible with a 5-minute p95: {HOOK_READS:g} is the floor (every job one read, none before it finished), "
        f"and with {HOOK_LOSS:.0%} lost a 5-minute p95 needs most lost ones found within 5 minutes, which takes "
        "reads before completion (about 0.35 a job with these durations; figure 10's webhook line holds the arm "
        "to 1.4)", ok=ok)
    row.notes.append(f"{MISS_PENDING} pending, every kind with webhooks, no sweeps; webhook answers "
                     f"{dict(hooked.hooks)}; {once}; run {hooked.wall:.0f} s real")
    return [row]


def per_day_text() -> str:
    return f"read budget {BIG_BUDGET[1]:,}/day and {BIG_BUDGET[0]}/min"
