"""Figure cost: dollars per 1,000 jobs and a month's bill at 1,000, 10,000 and 100,000 jobs a day, the
system counted call by call, beside what a team would build instead.

**The run.** The in-process stack (:class:`tools.stack.inprocess.InProcessStack`: the template's
handlers on moto server, a real redis-server, the Sume simulator over HTTP) on a compressed clock
(:func:`scale_for`), the template's defaults (sweeps on, the learned schedule, 512 MB arm64 functions).
Jobs arrive as a Poisson stream in the bench's mix of kinds (figure 9's: image median 20 s, video
6 min, ad video 12 min; 2 % of them with a 400 KB result, which goes to S3) and are **registered**
(``{"kind", "job_id", "key"}``, events/submit_register.json): created in the simulator directly, as
by another client. Creating them through submit would take Sume's create budget, 300 a day per
key: 4 keys at 1,000 a day, 34 at 10,000, 334 at 100,000 - read budgets need far fewer. Each load
gets as many keys as its reads need, ``JOBS_PER_KEY_DAY`` a day each (figure 10: one key serves
6,400 a day with sweeps; the figure prints the reads a day a key spent); keys are independent
(own budget, partitions, lane, metrics), so the run is **a slice**: one key at its per-key rate (10,000
and 100,000 a day share a rate, so one run prices both), and every per-key cost is multiplied by the
keys (fan-out's and the sweep's invocations are once a tick whatever the keys; their per-lane calls
and time scale; the per-key metrics and alarm contributors too). The learned schedule's
statistics are seeded as a deployment past its first hour holds them (200 observations a kind, its
items full-size); a warm-up long enough for sweeps to prove coverage follows (25 clock minutes; 45 in
a full run); then everything billable in a window is counted (:mod:`bench.cost_meter`) and divided by
the jobs that arrived in it (steady state). A run whose event source fell behind (its lag past due
over three SQS delay steps: the machine too busy for the clock) is flagged and misses the target.

**Pricing** (:mod:`bench.cost_prices`, each price with its page and date): per job, the window's
counts; per month, the window's rates times a month, plus every fixed cost (alarms counted from the
template, the dashboard, custom metrics counted from the EMF lines - prorated by the hours each is
sent in, as CloudWatch bills them - secrets, a month of records in the table and its PITR backups, a
month of large results in S3 and of logs, the event source's idle long polls, cold starts) and each
deployment's cache and network. Secrets and parameters are cached per container on real time, which
a compressed run cannot play: they are priced per warm container (twice each function's modelled
concurrency) at the layer's cache ages.

**Lambda duration.** Measured here per invocation: the handler's CPU time (its thread and each
poll message's worker thread) and its calls. On Lambda at 512 MB a function has 512/1769 of a
vCPU (1,769 MB is one vCPU), so CPU time counts 1769/512 = 3.46 times (a Graviton2 core taken as
fast as one of this machine's); each call adds a typical in-region latency (``LATENCY_MS``; moto's
are not AWS's) and each Sume request ``SUME_MS`` (an internet API; Sume does not publish one). A
poll batch's messages run concurrently: Lambda's SQS event source at these rates hands over about
one message per batch, so each message is priced as its own invocation (its own receive, delete
and re-queue request too) - the upper bound; a batching window is the lever.

**The alternatives**, priced on the same run's read schedule - the learned schedule the chains
follow, replayed for each job that arrived in the window on the models the run fitted
(:func:`chain_reads`: a workflow per job has no list to sweep, so it reads on its own until the job
is done; what it would cost reading only as often as sume-poller reads each job, with sweeps, is
in the notes): a Step Functions Standard workflow per job (register - DynamoDB
PutItem, then per read Wait, Task (a Lambda read), Choice; then UpdateItem, PutEvents, Succeed: 3
transitions a read plus 4), and a scheduled Lambda that every minute queries a due-time index in
DynamoDB and reads the due jobs (each read an UpdateItem moving the job in the index: 1 table WRU
plus a GSI delete and put). Neither needs Redis or a VPC; neither shares a read budget across
containers (the first has no place to keep one), which this figure does not price.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from bench import SCRATCH
from bench import cost_prices as P
from bench.cost_meter import Invocation, Meter, item_size
from bench.fig_discovery import KINDS, LIST_CAPABLE, arrivals
from bench.report import Row, info_row, plain, target_row

LOADS = (("1k/day", 1_000), ("10k/day", 10_000), ("100k/day", 100_000))
JOBS_PER_KEY_DAY = 5_000
#: How fast the clock runs, per slice: as fast as this machine keeps up with the slice's messages (SQS's
#: whole-second delays are 1/scale clock seconds): 20x at 1,000 jobs a day a key, 10x at 5,000.
def scale_for(per_key_day: float) -> float:
    return 0.05 if per_key_day <= 1_500 else 0.1


TICK = 60.0  # clock seconds between the schedules' ticks (rate(1 minute))
LARGE_SHARE, LARGE_BYTES = 0.02, 400_000
PARAMETERS = {"ReadsPerMinute": 120, "ReadsPerDay": 10_000, "CreatesPerMinute": 0, "CreatesPerDay": 0,
              "Sweeps": "true"}
#: Leases that outlast an in-process invocation at this clock (figure 9's); Sume timeouts to match.
ENV = {"CLAIM_TTL_SECONDS": "10", "LEASE_MARGIN_SECONDS": "5", "START_LEASE_SECONDS": "10",
       "SUME_CONNECT_TIMEOUT": "0.5", "SUME_READ_TIMEOUT": "1"}
TARGET = 0.5
#: The event source's lag past due, in SQS's delay steps (1/scale clock s), above which a run did not play the
#: schedule it was given (the machine too busy for the compressed clock): not a steady state, the target missed.
LAG_STEPS = 3

#: In-region latency of one call (ms), typical of each service's documented single-digit/low-tens of
#: milliseconds; a Redis round trip inside the VPC (ElastiCache) or over TLS to a hosted Redis in the
#: same region.
LATENCY_MS = {"dynamodb": 6.0, "sqs": 12.0, "events": 20.0, "s3": 25.0, "ssm": 15.0, "secretsmanager": 15.0,
              "kms": 10.0, "lambda": 25.0}
REDIS_MS = {"vpc": 0.6, "hosted": 2.0}
SUME_MS = 150.0
MEMORY_GB = 0.5  # replaced by the template's FunctionMemorySize as created
CPU_FACTOR = 1769 / 512
#: Bytes a call moves through a NAT gateway (request, TLS and response headers, a small body).
NAT_BYTES_PER_CALL = 3_000
#: Lambda's own log lines per invocation in JSON format, ``platform.start`` (about 130 bytes) and
#: ``platform.report`` (about 230: duration, billed duration, memory), written when the template's
#: SystemLogLevel is INFO; the in-process stack has no platform to write them.
PLATFORM_LOG_BYTES = 360
#: Lambda's SQS event source: long polls of 20 s per queue while it is idle (poll and create queue).
ESM_POLLERS, ESM_QUEUES = 5, 2
#: A cold start's billed init (the layer's imports at 512 MB; figure 4 measures the ratio) and how
#: often each container is replaced (AWS does not say; a few hours is what is commonly seen).
COLD_START_S, CONTAINER_HOURS = 1.5, 2.0
AZS = 2  # ElastiCache Serverless needs subnets in two zones; a NAT gateway per zone keeps egress up in both


@dataclass(frozen=True)
class Deployment:
    name: str
    redis: str  # "vpc" | "hosted"
    recommended: bool


DEPLOYMENTS = (
    Deployment("sume-poller (valkey serverless, VPC+NAT)", "vpc", True),
    Deployment("sume-poller (redis oss serverless, VPC+NAT)", "vpc", False),
    Deployment("sume-poller (cache.t4g.micro valkey, VPC+NAT)", "vpc", True),
    Deployment("sume-poller (hosted redis per command, no VPC)", "hosted", True),
    Deployment("sume-poller (hosted redis flat plan, no VPC)", "hosted", True),
)


@dataclass
class Window:
    """What one load's run counted in its window."""

    load: str
    jobs_per_day: int
    keys: int
    keys_run: int
    seconds: float  # clock seconds of the window
    arrivals: int  # jobs (of the keys run) that arrived in it
    scale: float = 1.0
    invocations: list[Invocation] = field(default_factory=list)
    status_reads: int = 0
    result_reads: int = 0
    list_reads: int = 0
    redis_server_commands: int = 0
    redis_bytes: int = 0
    #: Custom metrics (namespace, name, dimensions) -> EMF lines that carried them in the window: without a
    #: key dimension, and with one (the key run's).
    metrics_fixed: Counter[str] = field(default_factory=Counter)
    metrics_per_key: Counter[str] = field(default_factory=Counter)
    record_bytes: float = 0.0  # a terminal record's mean stored size
    lag_p95: float = 0.0
    wall: float = 0.0
    #: The poll steps' outcomes in the window (requeued, stretched, terminal...).
    outcomes: Counter[str] = field(default_factory=Counter)
    #: Sume reads per job on the learned schedule alone (no sweeps): the per-job workflows' schedule.
    chain_reads: float = 0.0

    @property
    def per_key(self) -> float:
        return self.keys / self.keys_run

    @property
    def month_factor(self) -> float:
        return P.SECONDS_PER_MONTH / self.seconds

    @property
    def jobs_per_month(self) -> float:
        return self.jobs_per_day * P.HOURS_PER_MONTH / 24

    @property
    def lagged(self) -> bool:
        return self.lag_p95 > LAG_STEPS / self.scale

    def reads_per_job(self) -> float:
        return (self.status_reads + self.result_reads) / self.arrivals


# -- the run --------------------------------------------------------------------------------------


def _arrivals(rate: float, span: float, seed: int) -> list[tuple[float, str, float, bool]]:
    """Figure 9's Poisson stream of its mix, each job marked large-result (LARGE_SHARE of them)."""
    rng = random.Random(seed + 1)
    return [(at, kind, duration, rng.random() < LARGE_SHARE) for at, kind, duration in arrivals(rate, span, seed)]


def chain_reads(kind: str, duration: float, model: Any, bounds: Any, rng: random.Random) -> int:
    """Sume reads a job of ``duration`` gets from its chain on the learned schedule alone (the planner's
    ``next_delay`` from age 0, each read seeing it running until it is done) plus its result read: what a
    workflow of its own, with no list to sweep, reads on the schedule the system uses."""
    from sume_poller.schedule.planner import next_delay

    age, last_running, reads = 0.0, None, 0
    while True:
        age += next_delay(kind, reads, age, last_running, model, bounds, None, rng)
        reads += 1
        if age >= duration:
            return reads + 1
        last_running = age


def _chain_schedule(stack: Any, plan: list[tuple[float, str, float, bool]], warmup: float, window: float,
                    seed: int) -> float:
    """Mean :func:`chain_reads` of the jobs that arrive in the window, on each kind's model as the seeded
    statistics fit it and the poll function's bounds."""
    from sume_poller.poll.poller import PollSettings
    from sume_poller.schedule.durations import intervals_from, model_from
    from sume_poller.schedule.models import HALF_LIFE
    from sume_poller.schedule.planner import Bounds

    schedule = PollSettings.from_env(os.environ).schedule
    bounds = Bounds(schedule.min_interval, schedule.max_interval, schedule.age_fraction)
    now = stack.clock.now()
    models = {k: model_from(intervals_from(stack.table.observations(k), now, HALF_LIFE)) for k in KINDS}
    rng = random.Random(seed)
    jobs = [(kind, duration) for at, kind, duration, _ in plan if warmup <= at < warmup + window]
    return sum(chain_reads(k, d, models[k], bounds, rng) for k, d in jobs) / max(1, len(jobs))


def _seed_statistics(stack: Any, rng: random.Random) -> None:
    """200 completion-time observations a kind (the learned schedule's sample, its items full-size)."""
    from sume_poller.store.records import STATS_SLOTS, stats_slot

    now = stack.clock.now()
    for kind, (median, sigma) in KINDS.items():
        filled: set[int] = set()
        for i in range(100 * STATS_SLOTS):
            if len(filled) == STATS_SLOTS:
                break
            job_id = f"job_seed_{kind}_{i:05d}"
            if (slot := stats_slot(job_id)) in filled:
                continue
            filled.add(slot)
            done = median * math.exp(sigma * rng.gauss(0.0, 1.0))
            stack.table.put_observation(kind, job_id, done * 0.97, done * 1.03, now)


def _metric_ids(lines: list[str]) -> tuple[Counter[str], Counter[str]]:
    """The custom metrics (namespace, name, dimensions) EMF lines create and how many lines carried each:
    without a key dimension, and with one (the key's name taken out)."""
    fixed: Counter[str] = Counter()
    per_key: Counter[str] = Counter()
    for line in lines:
        try:
            doc = json.loads(line[line.index("{"):])
        except ValueError:
            continue
        for directive in (doc.get("_aws") or {}).get("CloudWatchMetrics", []):
            for dims in directive.get("Dimensions", [[]]):
                for metric in directive.get("Metrics", []):
                    ident = (directive.get("Namespace"), metric.get("Name"),
                             tuple((d, "*" if d == "key" else str(doc.get(d))) for d in dims))
                    (per_key if "key" in dims else fixed)[json.dumps(ident)] += 1
    return fixed, per_key


def _alarms(keys: int) -> tuple[int, int, int]:
    """(standard alarm metrics, Metrics Insights alarms, dashboards) template.yaml makes with sweeps on,
    per-key alarms on (their defaults) and, with more than one key, a key configuration."""
    from tools.template import load

    conditions = {None: True, "SweepsOn": True, "PerKeyAlarmsOn": True, "HasKeysSecret": keys > 1, "WebhooksOn": False,
                  "MakeEventsQueue": False, "HasEventsTarget": False}
    metrics = insights = dashboards = 0
    for lid, resource in load()["Resources"].items():
        if resource["Type"] not in ("AWS::CloudWatch::Alarm", "AWS::CloudWatch::Dashboard"):
            continue
        if resource.get("Condition") not in conditions:
            raise ValueError(f"{lid}: condition {resource['Condition']} unknown to the cost figure")
        if not conditions[resource.get("Condition")]:
            continue
        queries = resource["Properties"].get("Metrics") or []
        if resource["Type"] == "AWS::CloudWatch::Dashboard":
            dashboards += 1
        elif any("SELECT" in str(q.get("Expression", "")) for q in queries):
            insights += 1
        else:
            metrics += max(1, sum(1 for q in queries if "MetricStat" in q))
    return metrics, insights, dashboards


def keys_for(jobs_per_day: int) -> int:
    return max(1, math.ceil(jobs_per_day / JOBS_PER_KEY_DAY))


def run(per_key_day: float, *, warmup: float, window: float, seed: int) -> Window:
    """One key's slice at ``per_key_day`` jobs a day: the default key, its budget Sume's documented one."""
    import boto3

    from tools.stack.inprocess import InProcessStack

    rng = random.Random(seed)
    rate = per_key_day / 86_400.0  # per clock second
    scale = scale_for(per_key_day)
    with InProcessStack(time_scale=scale, parameters=PARAMETERS, env=ENV,
                        log_path=SCRATCH / "bench-cost.log") as stack:
        global MEMORY_GB
        MEMORY_GB = stack.specs["PollFunction"].memory / 1024
        stack.sim.configure(list=LIST_CAPABLE)
        _seed_statistics(stack, rng)
        side = boto3.client("dynamodb", endpoint_url=stack.moto.endpoint_url, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")
        meter = Meter(side, stack.outputs["JobsTableName"])
        result = Window("slice", round(per_key_day), 1, 1, window, 0, scale=scale)
        plans = {"default": _arrivals(rate, warmup + window, seed)}
        result.chain_reads = _chain_schedule(stack, plans["default"], warmup, window, seed)
        with meter.installed(stack.sim.port):
            _drive(stack, meter, plans, warmup, window, result)
        return result


def _drive(stack: Any, meter: Meter, plans: dict[str, list[tuple[float, str, float, bool]]], warmup: float,
           window: float, result: Window) -> None:
    import redis

    from sume_poller.store.records import to_attrs

    clock, sim = stack.clock, stack.sim
    api_keys = {"default": stack.api_key, **stack.keys}
    feed = sorted((at, key, kind, duration, large) for key, plan in plans.items()
                  for at, kind, duration, large in plan)
    original = stack.invoke
    t0 = clock.now()
    lines: list[str] = []

    def log_size() -> int:
        stack._log.flush()
        return os.path.getsize(stack.log_path)

    def invoke(logical_id: str, event: Any) -> Any:
        offset = log_size()
        with meter.invoking(logical_id, clock.now() - t0, log_size) as invocation:
            reply = original(logical_id, event)
        if warmup <= invocation.clock_at < warmup + window:
            with open(stack.log_path, encoding="utf-8") as log:
                log.seek(offset)
                written = log.read()
            invocation.log_lines = written.count("\n")
            lines.extend(line for line in written.splitlines() if '"_aws"' in line)
        return reply

    stack.invoke = invoke
    server = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    snapshots: list[tuple[dict[str, Any], int, Counter[str]]] = []
    lags: list[float] = []
    fed, next_tick, started = 0, t0 + TICK, time.monotonic()
    try:
        while True:
            now = clock.now() - t0
            while fed < len(feed) and feed[fed][0] <= now:
                at, key, kind, duration, large = feed[fed]
                directives: dict[str, Any] = {"duration": duration, "hints": False}
                if large:
                    directives.update(result_shape="large", result_bytes=LARGE_BYTES)
                job_id = sim.seed_job(kind, directives, key=api_keys[key])
                stack.submit({"kind": kind, "job_id": job_id, **({} if key == "default" else {"key": key})})
                result.arrivals += warmup <= at < warmup + window
                fed += 1
            if len(snapshots) < 2 and now >= warmup + window * len(snapshots):
                commands = sum(int(v["calls"]) for k, v in server.info("commandstats").items() if k != "cmdstat_info")
                snapshots.append((sim.stats(), commands, Counter(stack.outcomes)))
                if len(snapshots) == 2:
                    result.redis_bytes = int(server.info("memory")["used_memory_dataset"])
                    break
            if clock.now() >= next_tick:
                stack.run_schedules()
                next_tick += TICK
            messages = stack.receive()
            if not messages:
                time.sleep(0.005)
                continue
            now = clock.now()
            lags += [now - float(json.loads(m["Body"]).get("due_at", now)) for m in messages]
            stack.deliver(messages)
    finally:
        stack.invoke = original
        server.close()
    result.wall = time.monotonic() - started
    result.invocations = [i for i in meter.invocations if warmup <= i.clock_at < warmup + window]
    (s0, c0, o0), (s1, c1, o1) = snapshots
    result.outcomes = o1 - o0
    for name in ("status_reads", "result_reads", "list_reads"):
        setattr(result, name, s1[name] - s0[name])
    result.redis_server_commands = c1 - c0
    result.metrics_fixed, result.metrics_per_key = _metric_ids(lines)
    terminal = [r for r in stack.table.scan() if r.get("status") not in (None, "pending")]
    result.record_bytes = sum(item_size(to_attrs(r)) for r in terminal) / max(1, len(terminal))
    lags.sort()
    result.lag_p95 = lags[int(0.95 * (len(lags) - 1))] if lags else 0.0


# -- the model ----------------------------------------------------------------------------------------


def _io_ms(io: Counter[str], redis: str) -> float:
    return sum(n * (REDIS_MS[redis] if k == "redis" else SUME_MS if k == "sume" else LATENCY_MS.get(k, 10.0))
               for k, n in io.items())


def _billed_ms(cpu_s: float, io_ms: float) -> int:
    return max(1, math.ceil(cpu_s * 1000 * CPU_FACTOR + io_ms))


@dataclass
class Bill:
    """One design's month: dollars by item."""

    items: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, item: str, dollars: float) -> None:
        self.items[item] += dollars

    def largest(self, n: int) -> list[tuple[str, float]]:
        return sorted(self.items.items(), key=lambda kv: -kv[1])[:n]

    @property
    def total(self) -> float:
        return sum(self.items.values())


def _lambda_month(w: Window, redis: str) -> tuple[defaultdict[str, float], defaultdict[str, float]]:
    """(units, Lambda) a month: every counted unit scaled to a month and to all keys, and per function
    Lambda requests and GB-seconds under the model (one poll message per invocation)."""
    units: defaultdict[str, float] = defaultdict(float)
    lam: defaultdict[str, float] = defaultdict(float)
    month, per_key = w.month_factor, w.per_key
    for inv in w.invocations:
        got = inv.units()
        if inv.function == "PollFunction":
            messages = inv.messages or []
            n = max(1, len(messages))
            main_io = _io_ms(inv.main.io, redis)
            sends = got["calls:sqs:SendMessageBatch"]
            entries = got.get("sqs_entries", 0) or sends
            for m in messages:
                ms = _billed_ms(m.cpu + inv.main.cpu / n, _io_ms(m.io, redis) + (main_io / n))
                lam[f"requests:{inv.function}"] += month * per_key
                lam[f"gb_s:{inv.function}"] += ms / 1000 * MEMORY_GB * month * per_key
            got["sqs_requests"] += 2 * len(messages) - sends + entries  # receive + delete each; a send each
        elif inv.function in ("FanOutFunction", "SweepFunction"):
            io = _io_ms(inv.main.io, redis) + max((_io_ms(u.io, redis) for u in inv.others.values()), default=0.0)
            tick_ms = _billed_ms(inv.cpu(), io) * per_key  # its lanes, one per key
            lam[f"requests:{inv.function}"] += month
            lam[f"gb_s:{inv.function}"] += tick_ms / 1000 * MEMORY_GB * month
        else:
            ms = _billed_ms(inv.cpu(), _io_ms(inv.main.io, redis))
            lam[f"requests:{inv.function}"] += month * per_key
            lam[f"gb_s:{inv.function}"] += ms / 1000 * MEMORY_GB * month * per_key
        got["log_bytes"] += inv.log_bytes
        got["lambda_invocations"] += 1
        for k, v in got.items():
            units[k] += v * month * per_key
    via_nat = ("calls:sqs:", "calls:events:", "calls:ssm:", "calls:secretsmanager:")  # S3, DynamoDB: gateway endpoints
    units["calls_via_nat"] = sum(v for k, v in units.items() if k.startswith(via_nat))
    for name in [k for k in lam if ":" in k]:
        lam[name.split(":")[0]] += lam[name]
    return units, lam


def warm_containers(lam: defaultdict[str, float]) -> int:
    """Execution environments Lambda keeps warm: per function, twice its mean concurrency (invocations a
    second x their billed seconds), at least one."""
    total = 0
    for name in [k for k in lam if k.startswith("requests:")]:
        function = name.split(":", 1)[1]
        concurrency = lam[f"gb_s:{function}"] / MEMORY_GB / P.SECONDS_PER_MONTH
        total += max(1, math.ceil(2 * concurrency))
    return total


def _secret_reads(keys: int, containers: int) -> tuple[float, float]:
    """(Secrets Manager calls, SSM SecureString reads - each a KMS decrypt) a month. The layer caches them
    per container on real time (a compressed run re-reads them 20x less often than AWS would), so they are
    priced per warm container as it reads them: the key configuration every KEYS_MAX_AGE (with named
    keys), the Redis user's password and the API key every CREDENTIALS_MAX_AGE."""
    from sume_poller.config.credentials import MAX_AGE as CREDENTIALS_MAX_AGE
    from sume_poller.config.keys import MAX_AGE as KEYS_MAX_AGE

    month = P.SECONDS_PER_MONTH
    secrets = containers * (month / KEYS_MAX_AGE * (keys > 1) + month / CREDENTIALS_MAX_AGE)
    return secrets, containers * month / CREDENTIALS_MAX_AGE


def metric_months(w: Window) -> float:
    """Custom metric-months: CloudWatch prorates a metric by the hours it is sent in, so each counts by the
    chance an hour holds at least one of its lines (Poisson at the window's rate); a key's, once per key."""
    def presence(lines: int) -> float:
        return 1 - math.exp(-lines * 3600 / w.seconds)

    return (sum(presence(n) for n in w.metrics_fixed.values())
            + w.keys * sum(presence(n) for n in w.metrics_per_key.values()))


def platform_log_bytes() -> int:
    """PLATFORM_LOG_BYTES where template.yaml keeps Lambda's platform lines (SystemLogLevel INFO or DEBUG)."""
    from tools.template import load

    level = load()["Globals"]["Function"]["LoggingConfig"].get("SystemLogLevel", "INFO")
    return PLATFORM_LOG_BYTES if level in ("INFO", "DEBUG") else 0


def price_sume_poller(w: Window, deployment: Deployment) -> Bill:
    units, lam = _lambda_month(w, deployment.redis)
    bill = Bill()
    bill.add("Lambda requests", lam["requests"] * P.LAMBDA_REQUEST.value)
    bill.add("Lambda GB-s", lam["gb_s"] * P.LAMBDA_GB_SECOND_ARM.value)
    idle_polls = ESM_POLLERS * ESM_QUEUES * P.SECONDS_PER_MONTH / 20
    bill.add("SQS", (units["sqs_requests"] + idle_polls) * P.SQS_REQUEST.value)
    bill.add("DynamoDB requests", units["ddb_rru"] * P.DDB_RRU.value
             + (units["ddb_wru"] + units["ddb_gsi_wru"]) * P.DDB_WRU.value)
    table_gb = w.record_bytes * w.jobs_per_month / 1e9
    bill.add("DynamoDB storage + PITR", table_gb * (P.DDB_STORAGE.value + P.DDB_PITR.value))
    bill.add("S3", units["s3_put"] * P.S3_PUT.value + units["s3_get"] * P.S3_GET.value
             + units["s3_bytes"] / 1e9 * P.S3_STORAGE.value)
    bill.add("EventBridge", units["eventbridge_events"] * P.EVENTBRIDGE_EVENT.value)
    secrets = 1 + (w.keys > 1)  # the Redis user's password; the key configuration
    containers = warm_containers(lam)
    secret_calls, decrypts = _secret_reads(w.keys, containers)
    bill.add("Secrets Manager / SSM / KMS", secrets * P.SECRET_MONTH.value + secret_calls * P.SECRETS_CALL.value
             + decrypts * (P.SSM_CALL.value + P.KMS_REQUEST.value))
    log_gb = (units["log_bytes"] + lam["requests"] * platform_log_bytes()) / 1e9
    bill.add("CloudWatch logs", log_gb * (P.CW_LOG_INGEST.value + P.CW_LOG_STORAGE.value))
    bill.add("CloudWatch metrics", metric_months(w) * P.CW_METRIC_MONTH.value)
    alarm_metrics, insights_alarms, dashboards = _alarms(w.keys)
    bill.add("CloudWatch alarms + dashboard", alarm_metrics * P.CW_ALARM_METRIC.value
             + insights_alarms * w.keys * P.CW_INSIGHTS_ALARM_METRIC.value + dashboards * P.CW_DASHBOARD.value)
    cold_starts = containers * P.HOURS_PER_MONTH / CONTAINER_HOURS
    bill.add("Lambda GB-s", cold_starts * COLD_START_S * MEMORY_GB * P.LAMBDA_GB_SECOND_ARM.value)
    redis_commands = units["redis_commands"]
    ecpu = w.redis_server_commands * w.month_factor * w.per_key
    data_gb = w.redis_bytes * w.per_key / 1e9
    name = deployment.name
    if "valkey serverless" in name:
        bill.add("cache", max(data_gb, P.VALKEY_MIN_GB) * P.VALKEY_SERVERLESS_GB_HOUR.value * P.HOURS_PER_MONTH
                 + ecpu * P.VALKEY_SERVERLESS_ECPU.value)
    elif "redis oss serverless" in name:
        bill.add("cache", max(data_gb, P.REDIS_MIN_GB) * P.REDIS_SERVERLESS_GB_HOUR.value * P.HOURS_PER_MONTH
                 + ecpu * P.REDIS_SERVERLESS_ECPU.value)
    elif "t4g.micro" in name:
        bill.add("cache", P.NODE_T4G_MICRO_VALKEY.value * P.HOURS_PER_MONTH)
    elif "flat plan" in name:
        bill.add("cache", max(P.REDIS_CLOUD_HOUR.value * P.HOURS_PER_MONTH, P.REDIS_CLOUD_MONTH_MIN.value))
    else:
        bill.add("cache", redis_commands * P.UPSTASH_COMMAND.value)
    if deployment.redis == "vpc":
        through_nat = (units["sume_requests"] + units["calls_via_nat"]) * NAT_BYTES_PER_CALL + units["s3_bytes"]
        bill.add("network (NAT)", AZS * (P.NAT_HOUR.value + P.PUBLIC_IPV4_HOUR.value) * P.HOURS_PER_MONTH
                 + through_nat / 1e9 * P.NAT_GB.value)
    return bill


def _read_task(w: Window) -> tuple[float, float, float]:
    """(billed ms, CPU s, log bytes) of one Lambda task that reads Sume once, from the poll messages'."""
    messages = [m for i in w.invocations if i.function == "PollFunction" for m in i.messages]
    polls = [i for i in w.invocations if i.function == "PollFunction"]
    cpu = sum(m.cpu for m in messages) / max(1, len(messages))
    logs = sum(i.log_bytes for i in polls) / max(1, len(messages))
    return cpu * 1000 * CPU_FACTOR + SUME_MS, cpu, logs


def price_step_functions(w: Window, units: defaultdict[str, float], reads: float | None = None) -> Bill:
    """A Standard workflow per job on the learned schedule (see the module docstring); ``reads``: a job's
    Sume reads, if not the learned schedule's."""
    jobs, reads = w.jobs_per_month, w.chain_reads if reads is None else reads
    ms, _, logs = _read_task(w)
    bill = Bill()
    bill.add("Step Functions transitions", jobs * (3 * reads + 4) * P.SFN_TRANSITION.value)
    bill.add("Lambda requests", jobs * reads * P.LAMBDA_REQUEST.value)
    bill.add("Lambda GB-s", jobs * reads * ms / 1000 * MEMORY_GB * P.LAMBDA_GB_SECOND_ARM.value)
    record_wru = math.ceil(w.record_bytes / 1024)
    bill.add("DynamoDB requests", jobs * (1 + record_wru) * P.DDB_WRU.value)
    bill.add("DynamoDB storage + PITR", w.record_bytes * jobs / 1e9 * (P.DDB_STORAGE.value + P.DDB_PITR.value))
    bill.add("S3", units["s3_put"] * P.S3_PUT.value + units["s3_bytes"] / 1e9 * P.S3_STORAGE.value)
    bill.add("EventBridge", jobs * P.EVENTBRIDGE_EVENT.value)
    bill.add("CloudWatch logs", jobs * reads * (logs + platform_log_bytes()) / 1e9
             * (P.CW_LOG_INGEST.value + P.CW_LOG_STORAGE.value))
    return bill


def price_due_index(w: Window, units: defaultdict[str, float]) -> Bill:
    """A Lambda every minute over a due-time index (see the module docstring)."""
    jobs, reads = w.jobs_per_month, w.chain_reads
    ms, _, logs = _read_task(w)
    ticks = P.SECONDS_PER_MONTH / 60
    due_per_tick = jobs * reads / ticks
    pages = max(1.0, due_per_tick / 100)  # a Query page per 100 due jobs (their index items ~200 bytes)
    threads = 10  # reads of a tick run concurrently
    tick_ms = _billed_ms(0.02, pages * LATENCY_MS["dynamodb"]) + due_per_tick * (ms + LATENCY_MS["dynamodb"]) / threads
    record_wru = math.ceil(w.record_bytes / 1024)
    bill = Bill()
    bill.add("Lambda requests", ticks * P.LAMBDA_REQUEST.value)
    bill.add("Lambda GB-s", ticks * tick_ms / 1000 * MEMORY_GB * P.LAMBDA_GB_SECOND_ARM.value)
    wru = jobs * (2 + reads * 3 + record_wru + 1)  # put + index put; per read 1 + index delete + put; the end
    bill.add("DynamoDB requests", wru * P.DDB_WRU.value + ticks * pages * 0.5 * P.DDB_RRU.value)
    bill.add("DynamoDB storage + PITR", w.record_bytes * jobs / 1e9 * (P.DDB_STORAGE.value + P.DDB_PITR.value))
    bill.add("S3", units["s3_put"] * P.S3_PUT.value + units["s3_bytes"] / 1e9 * P.S3_STORAGE.value)
    bill.add("EventBridge", jobs * P.EVENTBRIDGE_EVENT.value)
    bill.add("CloudWatch logs", (jobs * reads * logs + ticks * platform_log_bytes()) / 1e9
             * (P.CW_LOG_INGEST.value + P.CW_LOG_STORAGE.value))
    return bill


# -- the rows -----------------------------------------------------------------------------------------


def _per_thousand(bill: Bill, w: Window) -> float:
    return bill.total / w.jobs_per_month * 1000


def _dominant(bill: Bill, n: int = 3) -> str:
    return ", ".join(f"{k} {v / bill.total:.0%}" for k, v in bill.largest(n))


def rows_for(w: Window) -> tuple[list[Row], dict[str, Bill]]:
    units, _ = _lambda_month(w, "vpc")
    bills = {d.name: price_sume_poller(w, d) for d in DEPLOYMENTS}
    bills["step functions standard"] = price_step_functions(w, units)
    bills["scheduled lambda + due index"] = price_due_index(w, units)
    lagged = " (THE RUN LAGGED: not a steady state)" if w.lagged else ""
    row = info_row(f"cost {w.load}: dollars per 1,000 jobs and a month, per design{lagged}",
                   "; ".join(f"{n}: ${_per_thousand(b, w):.3f}/1k, ${b.total:,.2f}/month" for n, b in bills.items()),
                   f"{w.keys} keys ({w.keys_run} run), {w.arrivals} jobs in {w.seconds / 60:.0f} clock minutes")
    for name, bill in bills.items():
        row.lines.append(f"cost {w.load} {name}: {plain(_per_thousand(bill, w))}")
    for name, bill in bills.items():
        row.lines.append(f"monthly {w.load} {name}: {bill.total:,.2f} dollars")
    polls = [i for i in w.invocations if i.function == "PollFunction"]
    messages = sum(len(i.messages) for i in polls)
    alarms = _alarms(w.keys)
    reads_day = (w.status_reads + w.result_reads + w.list_reads) / w.keys_run / w.seconds * 86_400
    row.notes.append(
        f"{w.load}: {w.reads_per_job():.2f} status+result reads a job, {w.list_reads} list reads in the window, "
        f"poll steps {dict(w.outcomes)} "
        f"({reads_day:,.0f} reads a day per key of 10,000); {messages / max(1, w.arrivals):.2f} poll messages a job; "
        f"event source lag p95 {w.lag_p95:.0f} clock s; Redis data {w.redis_bytes / 1e3:.0f} kB a key; custom metrics "
        f"{len(w.metrics_fixed)} + {len(w.metrics_per_key)} a key ({metric_months(w):.0f} metric-months); alarms "
        f"{alarms[0]} metrics + {alarms[1]} query alarms ({alarms[1]} x {w.keys} metrics analyzed); a record "
        f"{w.record_bytes:.0f} B; {w.keys} keys; run {w.wall:.0f} s real")
    for name in (d.name for d in DEPLOYMENTS if d.recommended):
        row.notes.append(f"{w.load} {name}: dominated by {_dominant(bills[name])}")
    own = price_step_functions(w, units, w.reads_per_job())
    cheapest = min(bills[d.name].total for d in DEPLOYMENTS if d.recommended)
    row.notes.append(
        f"{w.load}: the workflows read on the learned schedule alone, {w.chain_reads:.2f} reads a job (they have "
        f"no list to sweep); a Step Functions workflow reading only as often as sume-poller reads each job "
        f"({w.reads_per_job():.2f}) would cost ${_per_thousand(own, w):.3f} per 1,000 jobs, ${own.total:,.2f} a "
        f"month (the cheapest recommended deployment / it: {cheapest / own.total:.2f})")
    return [row], bills


def measure(quick: bool = False, seed: int = 7) -> list[Row]:
    """Each distinct per-key rate of LOADS run once (10k and 100k a day share one: 2,000 a key), priced
    for every load it serves."""
    from bench.harness import layer_logs_to

    warmup, window, least = (1_500.0, 1_200.0, 40) if quick else (2_700.0, 3_600.0, 150)
    rows: list[Row] = []
    slices: dict[float, Window] = {}
    target: tuple[float, str] | None = None
    with layer_logs_to(SCRATCH / "bench-cost-layer.log"):
        for load, per_day in LOADS:
            per_key = per_day / keys_for(per_day)
            if per_key not in slices:  # enough arrivals in the window to average over
                slices[per_key] = run(per_key, warmup=warmup, window=max(window, least / per_key * 86_400),
                                      seed=seed)
            w = replace(slices[per_key], load=load, jobs_per_day=per_day, keys=keys_for(per_day))
            load_rows, bills = rows_for(w)
            rows += load_rows
            if per_day == 10_000:
                sfn = bills["step functions standard"].total
                best = min((d for d in DEPLOYMENTS if d.recommended), key=lambda d: bills[d.name].total)
                target = (bills[best.name].total / sfn, best.name, w)
    if target is not None:
        ratio, name, w = target
        lagged = f"; THE RUN LAGGED (event source p95 {w.lag_p95:.0f} clock s): not a steady state" if w.lagged else ""
        rows.append(target_row("cost", "10k/day sume-poller / step functions standard", ratio, "<=", TARGET,
                               f"{name}: the cheapest deployment the docs recommend, every fixed cost included{lagged}",
                               "a Step Functions Standard workflow per job on the same read schedule",
                               figure="cost 10k/day: sume-poller / Step Functions Standard, a month each",
                               ok=not w.lagged))
    return rows
