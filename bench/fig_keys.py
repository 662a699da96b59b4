"""Figure keys: one deployment serving many Sume keys (issue 23) - target lines ``keys ...``.

One driver (:class:`Deployment`) plays Lambda and SQS on a virtual clock around the layer's own
parts, wired as :mod:`sume_poller.wiring.poll` and :mod:`sume_poller.wiring.fanout` wire them: a
:class:`~sume_poller.config.keys.KeyRing` read from a key configuration (one entry per key, its limits),
the poll function's :class:`~sume_poller.poll.batch.BatchRunner` over per-key pollers
(:class:`~sume_poller.config.keys.PerKey`: each key's read budget under its own Redis key, its gate, its
Sume client), fan-out with a lane per key (:class:`~sume_poller.poll.fanout.Lane`) every 60 clock
seconds, a real redis-server, and the Sume simulator over HTTP enforcing each key's limits in its
own workspace (fixed minute and day windows on the same virtual clock). The job table is in
memory with :class:`~sume_poller.store.records.JobStore`'s semantics, its pending index partitioned per
key (``pNN:<key>``) as fan-out reads it. Submission is modelled as the submit function does it:
the record, the lease (``token:0``) and the first poll message.

The poll function's concurrency is modelled as the harness's event source models it
(:class:`bench.harness.EventSource`): at most :data:`CONCURRENCY` invocations at once (the
template's ``PollMaxConcurrency``), each a batch of up to 10 visible messages in arrival order
(``PollBatchSize``). An invocation holds its slot for the real time the batch took plus
:data:`READ_LATENCY` clock seconds per Sume read of its slowest record (its records run in
parallel): a step that waited for a read slot inside an invocation would hold poll concurrency
there and delay every key's messages queued behind it; re-queued steps hold nothing.

**Keys at once**: four keys with different read limits (:data:`LIMITS`), 50 jobs pending on each
that never finish and want a read every 2 s (the schedule's bounds pinned to 2 s, as figure 8
does): demand is 25 reads a second per key, above every key's budget. Fan-out starts each key's
chains from its own partitions within its own budget. The run is the end of a UTC day, each key's
limiter told that an even morning spent its share of the day (its ``day_used``; the simulator's
day window counts only the run's reads, so the day total is checked against the limiter's count:
served <= allowed): what a key's budget allows over the run is what its day has left,
``per_day x span / day`` (its minute limit would allow far more). served/budget = reads Sume
served the key / that allowance; 429s / attempts per key from the simulator's own count. The keys
whose reserve leaves a spare (acme, umbrella) spend it at their minute pace first, so both of a
key's limits are exercised. ``--quick`` runs the day's last hour (a full run its last 6 hours):
the day is a total, so a key whose demand stays above its budget is served what its day has left
either way, and the quick hour still holds 83 to 833 reads a key.

**Minute-bound** (information): the same keys and demand with no day limit, 5 clock minutes
(full: 15): served per whole minute window / the minute limit - the limiter's own grants per
window (:func:`~sume_poller.limits.budget.granted_per_window`): 0.964 of the limit, for one key as for many.

**Fairness**: key A with 1,000 pending long jobs (median 4 hours, already running for up to half
of that: a few per cent finish during the run and are not replaced), submitted at the start, and
key B beside it with a stream keeping 10 jobs pending (figure 9's mix: image 20 s, video 6 min,
ad video 12 min; the static schedules); both keys 120 a minute and 10,000 a day from 08:00. A's
budget binds: its spare above the day's reserve at its minute pace first (about half an hour),
then the day's even pace; each A chain re-queues for its reserved slot (hopping every 900 s while
the slot is further). B's p95 detection delay (Sume finishing a job -> its terminal record) over
the jobs Sume finished in the window, beside A and alone - the same plan and seed, the same
deployment and keys, A's jobs absent - in the same bench run. ``--quick``: a 30-minute window
after a 10-minute warm-up (full: 2 hours after 20 minutes); B's jobs are minutes long, so the
window holds tens of them either way, and A's budget binds at both paces within it. Beside them,
a counterfactual of the same plan (information): the run beside A with every step that waits for a
read slot holding its invocation for that wait (at most :data:`HOLD_MAX`), as a poller that slept
until its slot would - what "never hold poll concurrency" buys, and proof that the concurrency
model would see it.
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import random
import threading
import time
import uuid
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from bench import SCRATCH
from bench.report import Row, info_row, target_row

DAY = 86_400.0
#: The keys of "keys at once": reads a minute, reads a day (each key its own Sume workspace).
LIMITS: dict[str, tuple[int, int]] = {"acme": (120, 10_000), "globex": (60, 5_000), "initech": (30, 2_000),
                                      "umbrella": (240, 20_000)}
CONCURRENCY = 5  # PollMaxConcurrency (template default)
BATCH = 10  # PollBatchSize (template default)
READ_LATENCY = 0.2  # clock seconds one Sume read holds its invocation
HOLD_MAX = 27.0  # the invocation's 30 s less the 3 s safety margin (the counterfactual's longest hold)
VISIBILITY = 60.0  # clock seconds before a failed record's message is delivered again
TICK = 60.0  # fan-out's schedule (FanOutPeriodMinutes 1)
SHARDS = 8  # PendingShards (template default)
PER_KEY = 50  # keys at once: pending jobs per key
FAIR_KEYS = {"a": (120, 10_000), "b": (120, 10_000)}
A_PENDING, B_PENDING = 1_000, 10
A_MEDIAN, A_SIGMA = 4 * 3_600.0, 0.3
SERVED_X, THROTTLED_X, FAIR_X = 0.95, 0.001, 1.1
LOG = SCRATCH / "bench-keys.log"


def p95(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


# -- the job table ------------------------------------------------------------------------------------

class KeyedStore:
    """The job table in memory, with :class:`~sume_poller.store.records.JobStore`'s semantics for what
    submit, the poller and fan-out call: records, the sparse pending index by partition (a key's
    own ``pNN:<key>``), the outbox partitions (``oNN``) until the event is out. Thread-safe (a
    batch's records run on parallel threads)."""

    results = None

    def __init__(self, shards: int = SHARDS) -> None:
        self.shards = shards
        self.records: dict[str, dict[str, Any]] = {}
        self._index: dict[str, list[str]] = defaultdict(list)  # partition -> sorted job ids
        self._lock = threading.Lock()
        self.pending: Counter[str] = Counter()  # key -> pending jobs

    def _move(self, job_id: str, old: str | None, new: str | None) -> None:
        if old is not None:
            ids = self._index[old]
            i = bisect.bisect_left(ids, job_id)
            if i < len(ids) and ids[i] == job_id:
                del ids[i]
        if new is not None:
            bisect.insort(self._index[new], job_id)

    def put_pending(self, job_id: str, kind: str, *, now: float, deadline_at: int, key: str) -> None:
        from sume_poller.core.jobs import keyed_shard, shard_of

        shard = keyed_shard(shard_of(job_id, self.shards), key)
        with self._lock:
            self.records[job_id] = {"job_id": job_id, "kind": kind, "profile": kind, "status": "pending", "key": key,
                                    "pending_shard": shard, "deadline_at": deadline_at, "submitted_at": int(now)}
            self._move(job_id, None, shard)
            self.pending[key] += 1

    def get(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            record = self.records.get(job_id)
            return dict(record) if record else None

    def get_many(self, job_ids: list[str]) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {j: dict(self.records[j]) for j in job_ids if j in self.records}

    def record_terminal(self, job_id: str, outcome: Any, *, now: float, claim: Any = None) -> Any:
        from sume_poller.core.jobs import shard_of
        from sume_poller.store.records import TerminalWrite

        with self._lock:
            record = self.records.get(job_id)
            if record is None or record["status"] != "pending":
                return TerminalWrite(False, dict(record) if record else None)
            outbox = shard_of(job_id, self.shards, "o")
            self._move(job_id, record["pending_shard"], outbox)
            record.update(status=outcome.status, terminal_at=now, event_pending=True, pending_shard=outbox,
                          found_by=outcome.found_by, status_reads=outcome.status_reads, evidence=outcome.evidence,
                          result_reads=outcome.result_reads, **outcome.result,
                          **({"event_claim": claim.token, "chain_due_at": claim.until} if claim is not None else {}))
            self.pending[record["key"]] -= 1
            return TerminalWrite(True, dict(record))

    def claim_outbox(self, job_id: str, claim: Any, *, now: float) -> Any:
        from bench.harness import take_claim

        with self._lock:
            return take_claim(self.records.get(job_id), claim, now)

    def release_claim(self, job_id: str, token: str) -> bool:
        from bench.harness import free_claim

        with self._lock:
            return free_claim(self.records.get(job_id), token)

    def clear_outbox(self, job_id: str, *, now: float) -> bool:
        with self._lock:
            record = self.records[job_id]
            if record.pop("event_pending", None) is None:
                return False
            self._move(job_id, record.pop("pending_shard", None), None)
            return True

    def result_fields(self, job_id: str, result: Any) -> dict[str, Any]:
        return {"result_json": "{}", "result_bytes": 2}

    def put_observation(self, *args: Any, **kwargs: Any) -> None:
        pass

    def count(self, shard: str) -> int:
        with self._lock:
            return len(self._index.get(shard, ()))

    def pending_page(self, shard: str, start_key: dict[str, Any] | None,
                     limit: int = 100) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """One page of a partition in job id order; a full page names its last item (DynamoDB's
        LastEvaluatedKey), even when nothing follows."""
        with self._lock:
            ids = self._index.get(shard, [])
            i = bisect.bisect_right(ids, start_key["job_id"]["S"]) if start_key else 0
            page = ids[i:i + limit]
            last = {"pending_shard": {"S": shard}, "job_id": {"S": page[-1]}} if len(page) == limit else None
            return [dict(self.records[j]) for j in page], last

    def known_keys(self) -> set[str]:
        return set()


class _Bus:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: Counter[str] = Counter()

    def put_terminal(self, job_id: str, record: dict[str, Any]) -> None:
        with self._lock:
            self.events[job_id] += 1


# -- the deployment on a virtual clock ------------------------------------------------------------------

@dataclass
class Waits:
    """Per key: how long its visible messages waited for an invocation (clock s), and the poll
    concurrency the run held."""

    lags: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    busy: float = 0.0  # invocation-seconds held
    invocations: int = 0
    batch_wall: float = 0.0  # real seconds in BatchRunner.run


class Deployment:
    """The layer's poll and fan-out paths for the keys ``limits`` (id -> reads a minute, a day) on
    a virtual clock starting at ``start``; ``spent``: per key, reads of the current UTC day its
    limiter counts as spent before the run. ``hold_waits``: the counterfactual poller whose step
    waiting for a read slot holds its invocation for that wait (at most :data:`HOLD_MAX`)."""

    def __init__(self, redis_url: str, limits: dict[str, tuple[int, int]], *, start: float, seed: int,
                 schedule: Any, spent: dict[str, int] | None = None, hold_waits: bool = False) -> None:
        self.redis_url, self.limits, self.start, self.seed = redis_url, limits, start, seed
        self.hold_waits = hold_waits
        self.schedule, self.spent = schedule, spent or {}
        self.heap: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self._delivered = 0
        self.ready: deque[tuple[float, str, str]] = deque()  # (visible at, key, body), in arrival order
        self.free = CONCURRENCY
        self.waits = Waits()
        self.outcomes: dict[str, Counter[str]] = defaultdict(Counter)
        self.fanout_started: Counter[str] = Counter()
        self.jobs: dict[str, tuple[str, float]] = {}  # job id -> (key, arrival)

    def push(self, at: float, what: str, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (at, self._seq, what, payload))

    def __enter__(self) -> Deployment:
        from bench.fig_budget import VirtualClock
        from bench.harness import make_poller, virtual_poll_settings
        from sume_poller.config.keys import KeyRing, PerKey, SumeKey
        from sume_poller.config.settings import BudgetSettings, DiscoverySettings, KeySettings
        from sume_poller.limits.lease import LeaseStore
        from sume_poller.limits.redisconn import connect
        from sume_poller.poll.batch import BatchRunner
        from sume_poller.poll.fanout import FanOutSettings, Lane
        from sume_poller.store.queue import Outgoing, PollQueue
        from sume_poller.sume.client import SumeClient
        from sume_poller.wiring.shared import budget_of
        from tools.sume_sim import SumeSimulator

        self.clock = clock = VirtualClock(self.start)
        run = uuid.uuid4().hex[:8]
        self.prefix = prefix = f"bench:keys:{run}:"
        api = {key: f"sume_bench_{key}_{uuid.uuid4().hex}" for key in self.limits}
        sim_keys = {api[k]: {"workspace": k, "read_budget": {"per_minute": m or None, "per_day": d or None}}
                    for k, (m, d) in self.limits.items()}
        self.sim = SumeSimulator(api_key="sume_bench_default_" + uuid.uuid4().hex, hints=False, clock=clock,
                                 keys=sim_keys, deliver_webhooks=False).start()
        config = json.dumps({"keys": {k: {"api_key": api[k], "reads_per_minute": m, "reads_per_day": d}
                                      for k, (m, d) in self.limits.items()}})
        settings = virtual_poll_settings(clock, sume_url=self.sim.base_url, redis_url=self.redis_url, prefix=prefix,
                                         budget=BudgetSettings(120, 10_000, 0, 0), max_age=10 * int(DAY),
                                         schedule=self.schedule, discovery=DiscoverySettings(sweeps=False))
        self.client = client = connect(settings.redis)
        self.lease = LeaseStore(client, prefix)
        self.store, self.bus = KeyedStore(), _Bus()
        ring = KeyRing("default", None, read_config=lambda force: config, clock=time.monotonic)
        deployment = self

        class HeapQueue(PollQueue):  # the poll queue: SQS's whole-second delays into the driver's heap
            def _send_batch(self, chunk: list[Outgoing]) -> set[str]:
                for m in chunk:
                    deployment.push(clock.t + self.real_delay(m.delay), "visible", m.body)
                return set()

        self.queue = queue = HeapQueue("memory://poll", clock, sqs=object())
        rngs = {k: random.Random(f"{self.seed}:{k}") for k in self.limits}

        def of_key(key: SumeKey) -> Any:
            budget = budget_of(client, prefix, key, "reads", settings.common, settings.budget.reserve_every)
            poller = make_poller(settings, lease=self.lease, budget=budget, store=self.store, bus=self.bus,
                                 queue=queue, sume=SumeClient(self.sim.base_url, key.api_key))
            poller.cadence.rng = rngs[key.id]
            return poller

        self.runner = BatchRunner(PerKey(ring, of_key), queue, safety_margin_ms=settings.safety_margin_ms,
                                  default_key="default")
        self.fan_settings = FanOutSettings(common=settings.common, poll_queue_url="memory://poll", redis=settings.redis,
                                           lease=settings.lease, jobs=settings.jobs, keys=KeySettings(),
                                           budget=settings.budget, period=TICK)
        self.lanes = [Lane(k.id, budget_of(client, prefix, k, "reads", settings.common, settings.budget.reserve_every),
                           k.scope(prefix), named=True) for k in ring.all()]
        day_end = (math.floor(self.start / DAY) + 1) * DAY
        for lane in self.lanes:
            if self.spent.get(lane.key):
                client.hset(lane.budget.key, mapping={"day_used": self.spent[lane.key],
                                                      "day_reset": int(day_end * 1000)})
        self.ttl_ms = settings.lease.start_ttl * 1000
        self.max_age = settings.jobs.max_age
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for key in self.client.scan_iter(match=f"{self.prefix}*", count=1_000):
                self.client.delete(key)
        finally:
            self.sim.stop()

    # -- what the driver plays ----------------------------------------------------------------------
    def submit(self, at: float, key: str, kind: str, duration: float, *, age: float = 0.0, chain: bool = True) -> None:
        """A job of ``key`` arriving at clock time ``at`` (Sume created it ``age`` seconds before);
        ``chain``: as submit does it (the lease and the first message), else only the record (a
        backlog fan-out starts)."""
        self.push(at, "arrive", (key, kind, duration, age, chain))

    def _arrive(self, key: str, kind: str, duration: float, age: float, chain: bool) -> None:
        from sume_poller.core.messages import PollMessage
        from sume_poller.limits.lease import new_token

        now = self.clock.t
        job_id = self.sim.seed_job(kind, {"duration": duration, "hints": False}, age=age, workspace=key)
        deadline = int(now - age) + self.max_age
        self.store.put_pending(job_id, kind, now=now - age, deadline_at=deadline, key=key)
        self.jobs[job_id] = (key, now)
        if chain:
            token = new_token()
            self.lease.start(job_id, token, self.ttl_ms)
            self.push(now, "visible", PollMessage(job_id=job_id, kind=kind, deadline_at=deadline, due_at=now,
                                                  token=token, seq=0, submitted_at=int(now - age), key=key).to_json())

    def _tick(self) -> None:
        from sume_poller.poll.fanout import FanOut

        report = FanOut(self.fan_settings, self.store, self.queue, self.lease, None, lambda: 60_000,
                        lanes=self.lanes).run()
        self.fanout_started.update(report.started_by_key)

    def _dispatch(self) -> None:
        """Invocations while a slot is free and messages are visible: up to 10 each, oldest first."""
        while self.free and self.ready:
            taken = [self.ready.popleft() for _ in range(min(BATCH, len(self.ready)))]
            now = self.clock.t
            records = []
            for visible, key, body in taken:
                self.waits.lags[key].append(now - visible)
                self._delivered += 1
                records.append({"messageId": f"m{self._delivered}", "body": body})
            started = time.monotonic()
            report = self.runner.run({"Records": records}, lambda: 30_000)
            wall = time.monotonic() - started
            held = wall + max((self._hold(o) for o in report.outcomes), default=0.0)
            self.waits.busy += held
            self.waits.invocations += 1
            self.waits.batch_wall += wall
            for o in report.outcomes:
                self.outcomes[o.key or "default"][o.name] += 1
            failed = set(report.failures)
            for r, (_, _, body) in zip(records, taken, strict=True):
                if r["messageId"] in failed:
                    self.push(now + VISIBILITY, "visible", body)
            self.free -= 1
            self.push(now + held, "free")

    def _hold(self, outcome: Any) -> float:
        """Clock seconds one record keeps its invocation beyond the batch's real time."""
        wait = 0.0
        if self.hold_waits and outcome.name == "budget_wait" and outcome.send is not None:
            wait = min(outcome.send.delay, HOLD_MAX)
        return READ_LATENCY * outcome.reads + wait

    def run(self, until: float, *, ticks_from: float | None = None,
            stop: Any = None) -> None:
        """Play events up to clock time ``until`` (fan-out every :data:`TICK` from ``ticks_from``,
        default the start); ``stop()`` true at a tick ends the run early."""
        first = self.start if ticks_from is None else ticks_from
        for n in range(int((until - first) // TICK) + 1):
            self.push(first + n * TICK, "tick")
        while self.heap and self.heap[0][0] < until:
            at, _, what, payload = heapq.heappop(self.heap)
            self.clock.t = max(self.clock.t, at)
            if what == "visible":
                self.ready.append((at, json.loads(payload).get("key") or "default", payload))
            elif what == "free":
                self.free += 1
            elif what == "arrive":
                self._arrive(*payload)
            elif what == "tick":
                if stop is not None and stop():
                    break
                self._tick()
            self._dispatch()
        self.clock.t = max(self.clock.t, until)

    # -- what the run did -----------------------------------------------------------------------------
    def delays(self, key: str, w0: float, w1: float) -> tuple[list[float], int]:
        """Detection delays of ``key``'s jobs Sume finished in [w0, w1) (not recorded: so far, a
        lower bound), and how many of those were not recorded."""
        from bench.fig_discovery import _when

        out, unrecorded = [], 0
        for job_id, (k, _) in self.jobs.items():
            if k != key:
                continue
            done = _when(self.sim.job_info(job_id)["terminal_at"])
            if not w0 <= done < w1:
                continue
            record = self.store.records[job_id]
            if record["status"] == "pending":
                unrecorded += 1
                out.append(self.clock.t - done)
            else:
                out.append(float(record["terminal_at"]) - done)
        return out, unrecorded


# -- keys at once -------------------------------------------------------------------------------------------

@dataclass
class KeyServed:
    key: str
    per_minute: int
    per_day: int
    allowed: float  # reads the key's budget allows over the window
    attempts: int
    served: int
    refused: int
    minute_max: float  # the most served in one minute window / the minute limit
    started: int  # chains fan-out started for the key

    @property
    def ratio(self) -> float:
        return self.served / self.allowed

    @property
    def throttled(self) -> float:
        return self.refused / self.attempts if self.attempts else 0.0


def keys_at_once(redis_url: str, quick: bool, seed: int) -> tuple[list[KeyServed], Deployment, float]:
    from bench.fig_budget import START
    from sume_poller.config.settings import ScheduleSettings

    span = 3_600.0 if quick else 6 * 3_600.0
    start = START + DAY - span
    spent = {k: round(d * (DAY - span) / DAY) for k, (_, d) in LIMITS.items()}
    started = time.monotonic()
    with Deployment(redis_url, LIMITS, start=start, seed=seed, schedule=ScheduleSettings(False, 2.0, 2.0),
                    spent=spent) as dep:
        for key in LIMITS:
            for _ in range(PER_KEY):  # a backlog: fan-out starts each key's chains within its budget
                dep.submit(start, key, "image", 100 * DAY, chain=False)
        dep.run(START + DAY)
        sim = dep.sim.stats()["keys"]
        windows = dep.sim.budget_stats()["keys"]
    out = []
    for key, (m, d) in LIMITS.items():
        reads = sim[key]["reads"]
        minutes = [w for w in windows[key]["reads"]["60"] if w["limit"]]
        allowed = min(m * span / 60, d - spent[key])
        out.append(KeyServed(key, m, d, allowed, reads["attempts"], reads["served"], reads["rate_limited"],
                             max(w["served"] for w in minutes) / m, dep.fanout_started[key]))
    return out, dep, time.monotonic() - started


def minute_bound(redis_url: str, quick: bool, seed: int) -> tuple[dict[str, list[int]], float]:
    """The same four keys with their minute limits alone (no day limit: the minute binds), the
    same demand, from a minute boundary: served per whole minute window of the run, per key."""
    from bench.fig_budget import START
    from sume_poller.config.settings import ScheduleSettings

    span = 300.0 if quick else 900.0
    limits = {k: (m, 0) for k, (m, _) in LIMITS.items()}
    started = time.monotonic()
    with Deployment(redis_url, limits, start=START, seed=seed, schedule=ScheduleSettings(False, 2.0, 2.0)) as dep:
        for key in limits:
            for _ in range(PER_KEY):
                dep.submit(START, key, "image", 100 * DAY, chain=False)
        dep.run(START + span)
        windows = dep.sim.budget_stats()["keys"]
    return {k: [w["served"] for w in windows[k]["reads"]["60"] if w["limit"] and w["start"] >= START
                and w["start"] + 60 <= START + span] for k in limits}, time.monotonic() - started


def _minute_row(redis_url: str, quick: bool, seed: int) -> Row:
    from sume_poller.limits.budget import granted_per_window

    served, wall = minute_bound(redis_url, quick, seed)
    parts = {k: (min(v) / LIMITS[k][0], sum(v) / len(v) / LIMITS[k][0]) for k, v in served.items()}
    row = info_row("keys minute-bound (no day limit): served / minute limit per minute window, min - "
                   + " / ".join(LIMITS), " / ".join(f"{lo:.3f}" for lo, _ in parts.values())
                   + f" over {len(next(iter(served.values())))} minute windows",
                   "the limiter's grants per minute in an overload (granted_per_window) / limit: "
                   + " / ".join(f"{granted_per_window(m) / m:.3f}" for m, _ in LIMITS.values()))
    row.notes.append(
        "where a key's minute limit binds for long (no day limit), the limiter's line grants L over 62.25 s (its read "
        "log keeps every 61 s at most L, so no minute of Sume's sees more, fixed or sliding): 0.964 of L, the same "
        f"for one key or many; served per window: {dict(served)}; {wall:.0f} s real")
    return row


def _keys_rows(redis_url: str, quick: bool, seed: int) -> list[Row]:
    served, dep, wall = keys_at_once(redis_url, quick, seed)
    rows = []
    for s in served:
        rows.append(target_row("keys", f"served/budget {s.key}", s.ratio, ">=", SERVED_X,
                               f"{s.served:,} reads served of {s.attempts:,} attempts"
                               + ("" if s.served <= s.allowed else " - MORE THAN THE BUDGET ALLOWS"),
                               f"{s.key} ({s.per_minute}/min, {s.per_day:,}/day): {s.allowed:,.0f} allowed",
                               figure=f"keys at once: served/budget, key {s.key} ({s.per_minute}/min, "
                                      f"{s.per_day:,}/day)", ok=s.served <= s.allowed))
    for s in served:
        rows.append(target_row("keys", f"429s/attempts {s.key}", s.throttled, "<=", THROTTLED_X,
                               f"{s.refused} of {s.attempts:,} attempts refused (429)",
                               f"most served in one minute window: {s.minute_max:.2f} of {s.per_minute}",
                               figure=f"keys at once: 429s/attempts, key {s.key}"))
    span = (DAY - (dep.start % DAY)) / 3_600
    rows[0].notes.append(
        f"virtual clock, the last {span:.0f} h of a UTC day, each limiter's day_used as an even morning leaves it; "
        f"{PER_KEY} never-ending jobs a key wanting a read every 2 s; fan-out started "
        + ", ".join(f"{s.key} {s.started}" for s in served) + " chains; poll outcomes by key: "
        + "; ".join(f"{k} {dict(v)}" for k, v in sorted(dep.outcomes.items()))
        + f"; {dep.waits.invocations} invocations ({CONCURRENCY} at once at most), messages waited for one p95 "
        + ", ".join(f"{k} {p95(v):.1f} s" for k, v in sorted(dep.waits.lags.items()))
        + f"; {wall:.0f} s real")
    rows.append(_minute_row(redis_url, quick, seed))
    return rows


# -- fairness -------------------------------------------------------------------------------------------------

def _b_plan(span: float, seed: int) -> list[tuple[float, str, float]]:
    from bench.fig_discovery import KINDS, arrivals
    from bench.fig_discovery import TICK as NINE_TICK

    mean = sum(m * math.exp(s * s / 2) for m, s in KINDS.values()) / len(KINDS)
    return arrivals(B_PENDING / (mean + NINE_TICK / 2), span, seed)


def _a_plan(seed: int) -> list[tuple[str, float, float]]:
    """A's 1,000 long jobs as a running batch has them: (kind, duration, age)."""
    rng = random.Random(seed + 1)
    mu = math.log(A_MEDIAN)
    out = []
    for _ in range(A_PENDING):
        duration = math.exp(mu + A_SIGMA**2 + A_SIGMA * rng.gauss(0.0, 1.0))
        out.append(("video", round(duration, 1), rng.uniform(0.0, duration * 0.5)))
    return out


@dataclass
class FairRun:
    delays: list[float]
    unrecorded: int
    b_lag: float  # p95 seconds B's messages waited past due for an invocation
    a_reads: int
    a_attempts: int
    a_refused: int
    b_reads: int
    outcomes: dict[str, Counter[str]]
    busy: float
    invocations: int
    wall: float
    a_minute_max: float


def fair_run(redis_url: str, *, beside: bool, quick: bool, seed: int, hold_waits: bool = False) -> FairRun:
    from bench.fig_budget import START
    from sume_poller.config.settings import ScheduleSettings

    warmup, window = (600.0, 1_800.0) if quick else (1_200.0, 7_200.0)
    drain = 1_800.0
    start = START + 8 * 3_600.0  # 08:00, the day's budget fresh
    started = time.monotonic()
    with Deployment(redis_url, FAIR_KEYS, start=start, seed=seed, schedule=ScheduleSettings(learned=False),
                    hold_waits=hold_waits) as dep:
        if beside:
            for kind, duration, age in _a_plan(seed):
                dep.submit(start, "a", kind, duration, age=age)
        for at, kind, duration in _b_plan(warmup + window, seed):
            dep.submit(start + at, "b", kind, duration)
        w0, w1 = start + warmup, start + warmup + window

        def b_done() -> bool:
            return dep.clock.t >= w1 and dep.store.pending["b"] == 0

        dep.run(w1 + drain, stop=b_done)
        delays, unrecorded = dep.delays("b", w0, w1)
        sim = dep.sim.stats()["keys"]
        minutes = [w for w in dep.sim.budget_stats()["keys"]["a"]["reads"]["60"] if w["limit"]]
        return FairRun(delays, unrecorded, p95(dep.waits.lags["b"]), sim["a"]["reads"]["served"],
                       sim["a"]["reads"]["attempts"], sim["a"]["reads"]["rate_limited"], sim["b"]["reads"]["served"],
                       dict(dep.outcomes), dep.waits.busy, dep.waits.invocations, time.monotonic() - started,
                       max((w["served"] for w in minutes), default=0) / FAIR_KEYS["a"][0])


def _fair_rows(redis_url: str, quick: bool, seed: int) -> list[Row]:
    alone = fair_run(redis_url, beside=False, quick=quick, seed=seed)
    beside = fair_run(redis_url, beside=True, quick=quick, seed=seed)
    held = fair_run(redis_url, beside=True, quick=quick, seed=seed, hold_waits=True)
    ratio = p95(beside.delays) / p95(alone.delays)
    ok = not beside.unrecorded and not alone.unrecorded and len(beside.delays) == len(alone.delays)
    row = target_row("keys", "fairness B p95 beside A / alone", ratio, "<=", FAIR_X,
                     f"B's p95 detection delay beside A {p95(beside.delays):.0f} s ({len(beside.delays)} jobs Sume "
                     f"finished in the window, {beside.unrecorded} not recorded)",
                     f"B alone: {p95(alone.delays):.0f} s ({len(alone.delays)} jobs, {alone.unrecorded} not recorded); "
                     f"counterfactual, waiting steps holding their invocation (at most {HOLD_MAX:.0f} s): B beside A "
                     f"{p95(held.delays):.0f} s ({p95(held.delays) / p95(alone.delays):.1f}x alone"
                     + (f"; {held.unrecorded} not recorded by the end: lower bounds)" if held.unrecorded else ")"),
                     figure=f"keys fairness: key B ({B_PENDING} pending) p95 detection delay beside key A "
                            f"({A_PENDING:,} pending, its budget binding) / B alone", ok=ok)
    a = beside.outcomes.get("a", Counter())
    row.notes.append(
        f"both keys {FAIR_KEYS['a'][0]}/min, {FAIR_KEYS['a'][1]:,}/day from 08:00; A: {beside.a_reads} reads served "
        f"({beside.a_refused} of {beside.a_attempts} refused, the most in a minute {beside.a_minute_max:.2f} of its "
        f"limit), its steps {dict(a)}; B: {beside.b_reads} reads beside A, {alone.b_reads} alone; B's messages waited "
        f"for an invocation p95 {beside.b_lag:.2f} s beside A, {alone.b_lag:.2f} s alone; poll concurrency held "
        f"{beside.busy:.0f} / {alone.busy:.0f} invocation-seconds in {beside.invocations} / {alone.invocations} "
        f"invocations; B's p50 delay {sorted(beside.delays)[len(beside.delays) // 2]:.0f} / "
        f"{sorted(alone.delays)[len(alone.delays) // 2]:.0f} s; counterfactual (waiting steps hold their invocation): "
        f"B's messages waited for one p95 {held.b_lag:.0f} s, {held.busy:.0f} invocation-seconds held; runs "
        f"{beside.wall:.0f} / {alone.wall:.0f} / {held.wall:.0f} s real")
    return [row]


def measure(quick: bool = False, seed: int = 7) -> list[Row]:
    from bench.harness import layer_logs_to
    from tools.services import RedisServer

    rows: list[Row] = []
    timings = []
    with layer_logs_to(LOG), RedisServer() as server:
        for name, part in (("keys at once", _keys_rows), ("fairness", _fair_rows)):
            started = time.monotonic()
            rows += part(server.url, quick, seed)
            timings.append(f"{name} {time.monotonic() - started:.0f} s")
    rows[0].notes.append("real time per part: " + ", ".join(timings))
    return rows

