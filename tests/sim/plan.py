"""What a schedule holds: everything a seed decides before the first step, and the faults it may inject.

A :class:`Plan` is drawn from the seed alone (its own RNG stream, so a plan does not depend on the
scheduler's choices): the jobs (a few, each with the Sume behaviour the simulator's ``sim``
directives give it), how they arrive (submissions, some with the same Idempotency-Key twice, some
registered by id), the deployment's parameters (the template's, within their bounds), the
simulator's configuration (hints, list-route mode, webhooks, budgets), and the environment's faults
(Redis outages, flushes and restarts at chosen times) - and the rates and budgets of the faults the
scheduler injects as it goes (:class:`Faults`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

KINDS = ("image", "video", "face_swap", "reference_analysis", "ad_video")
#: Status-read faults Sume sends (the simulator's vocabulary): transient ones, and - rarely - a client
#: error a proxy or gateway might answer with (the contract does not name them for a job read).
TRANSIENT = ("429:2", "500", "503:1", "malformed", "html", "empty", "slow:4000", "slow:15000")
CLIENT_ERRORS = ("400", "410", "422")
RESULT_FAULTS = ("500", "429:1", "503", "slow:15000", "malformed")
RESULT_REFUSALS = ("400", "402", "403", "410")
OUTCOMES = (("completed", 50), ("succeeded", 6), ("failed", 14), ("error", 4), ("canceled", 6), ("expired", 6),
            ("complete", 4))

#: Lambda timeouts (template.yaml: Globals 30 s; fan-out and sweeps 60 s; webhook 10 s).
TIMEOUTS = {"poll": 30.0, "submit": 30.0, "fanout": 60.0, "sweep": 60.0, "webhook": 10.0}
#: The poll and create queues' visibility timeout and redrive policy (template.yaml).
VISIBILITY, MAX_RECEIVE = 180.0, 5


@dataclass
class JobPlan:
    kind: str
    sim: dict[str, Any]
    at: float  # clock seconds after the start: when it is submitted
    #: Registered by id (a job started elsewhere) instead of created through submit.
    register: bool = False
    #: The same submission (same Idempotency-Key) sent twice, this far apart (None: once).
    again_after: float | None = None
    queue: bool = True


@dataclass
class Plan:
    seed: int
    jobs: list[JobPlan]
    env: dict[str, str]
    sume: dict[str, Any]
    batch_size: int
    concurrency: int
    rates: dict[str, float]
    budget: dict[str, int]
    #: (clock seconds after the start, "outage" | "flush" | "restart", seconds).
    redis: list[tuple[float, str, float]] = field(default_factory=list)
    advance: float = 0.02
    max_steps: int = 600
    #: The scheduler's way of picking (:class:`~tests.sim.scheduler.Scheduler`'s ``mode``).
    mode: str = "random"

    def describe(self) -> str:
        jobs = ", ".join(f"{j.kind}:{j.sim.get('outcome', 'completed')}" + ("(reg)" if j.register else "")
                         for j in self.jobs)
        faults = ", ".join(f"{k}@{t:.0f}" for t, k, _ in self.redis)
        return (f"jobs [{jobs}]; redis [{faults}]; batch {self.batch_size}x{self.concurrency}; "
                f"{self.mode} picks, clock moves {self.advance}")


def _weighted(rng: random.Random, options: tuple[tuple[str, int], ...]) -> str:
    return rng.choices([o for o, _ in options], [w for _, w in options])[0]


def draw(seed: int) -> Plan:
    """The plan of schedule ``seed``."""
    rng = random.Random(seed * 7919 + 17)
    max_age = rng.choice([120, 300, 600])
    webhook_kinds = rng.choice([[], [], ["video"], ["image", "video"]])
    jobs = [_job(rng, webhook_kinds) for _ in range(rng.choice([1, 2, 2, 2, 3]))]
    reads = rng.choice([30, 60, 120])
    creates = rng.choice([1, 2, 10, 10])
    env = {
        "JOBS_TABLE": "jobs", "TIME_SCALE": "1", "LOCAL_ENDPOINTS": "true",
        "REDIS_URL": "redis://127.0.0.1:6379/0", "SUME_BASE_URL": "http://sume.sim.invalid/api/v1",
        "SUME_API_KEY_NAME": "/sume/key", "EVENT_BUS_NAME": "default", "RESULT_BUCKET": "results",
        "JOB_MAX_AGE_SECONDS": str(max_age), "NOT_FOUND_GRACE_SECONDS": str(rng.choice([30, 300])),
        "PENDING_SHARDS": str(rng.choice([1, 2])), "LEASE_MARGIN_SECONDS": str(rng.choice([5, 30, 120])),
        "CLAIM_TTL_SECONDS": "60", "START_LEASE_SECONDS": str(rng.choice([60, 600])),
        "READS_PER_MINUTE": str(reads), "READS_PER_DAY": "10000",
        "CREATES_PER_MINUTE": str(creates), "CREATES_PER_DAY": "300",
        "LEARNED_SCHEDULE": rng.choice(["true", "false"]), "SWEEPS": rng.choice(["true", "true", "false"]),
        "SWEEP_SAFETY_SECONDS": str(rng.choice([60, 300, 900])), "SWEEP_CHECK_SECONDS": "60",
        "SWEEP_LAG_SECONDS": str(rng.choice([0, 60])), "SWEEP_READ_SHARE_PERCENT": "10",
        "SUBMIT_QUEUE_DEADLINE_SECONDS": str(rng.choice([60, 600])), "SAFETY_MARGIN_MS": "3000",
        "WEBHOOK_KINDS": ",".join(webhook_kinds), "WEBHOOK_URL": "https://hooks.sim.invalid/sume",
        "WEBHOOK_SECRET_NAME": "/sume/webhook", "WEBHOOK_TOLERANCE_SECONDS": "300",
        "FANOUT_PERIOD_MINUTES": "1", "SWEEP_PERIOD_MINUTES": "1",
        "POLL_QUEUE_URL": "https://sqs.sim/000000000000/poll", "CREATE_QUEUE_URL": "https://sqs.sim/000000000000/create",
    }
    concurrency = rng.choice([2, 2, 3])
    env["POLL_MAX_CONCURRENCY"] = str(concurrency)
    listing = {"status_filter": _weighted(rng, (("honoured", 6), ("ignored", 2), ("loose", 2))),
               "cursor": rng.random() < 0.5, "fields": rng.choice(["minimal", "full"]),
               "order": rng.choice(["any", "newest_first", "newest_created"]),
               "item_status": rng.random() < 0.9,
               "route": _weighted(rng, (("ok", 8), ("missing", 1), ("forbidden", 1))),
               "lag": rng.choice([0.0, 0.0, 20.0]), "foreign": rng.choice([0, 0, 2])}
    if rng.random() < 0.2:
        listing["faults"] = [rng.choice(["503", "malformed", "ok"]), rng.choice(["503", "ok"])]
    sume = {"hints": rng.random() < 0.8, "result_not_ready": rng.choice([404, 409, 425]),
            "read_budget": {"per_minute": reads, "per_day": 10000},
            "create_budget": {"per_minute": creates, "per_day": 300}, "list": listing,
            "webhooks": {"kinds": webhook_kinds, "loss": rng.choice([0.0, 0.3, 1.0]),
                         "duplicate": rng.choice([0.0, 0.3]), "bad_signature": rng.choice([0.0, 0.0, 0.2]),
                         "delay": rng.choice([0.0, 2.0])}}
    redis: list[tuple[float, str, float]] = []
    if rng.random() < 0.25:
        redis.append((rng.uniform(0, 150), "outage", rng.choice([20.0, 90.0, 240.0])))
    if rng.random() < 0.12:
        redis.append((rng.uniform(0, 150), rng.choice(["flush", "restart"]), 0.0))
    rates = {
        "crash": rng.choice([0.0, 0.004, 0.01]),  # an invocation crashing at a service call
        "timeout": rng.choice([0.0, 0.1, 0.3]),  # the clock passing a running invocation's end
        "crash_step": rng.choice([0.0, 0.01, 0.03]),  # ... at one of the poller's named steps
        "ddb_throttle": rng.choice([0.0, 0.0, 0.005, 0.02]),
        "sqs_throttle": rng.choice([0.0, 0.01]), "sqs_entry_failed": rng.choice([0.0, 0.01]),
        "sqs_duplicate": rng.choice([0.0, 0.05, 0.2]),
        "redis_lost_reply": rng.choice([0.0, 0.0, 0.01]),
        "s3_error": rng.choice([0.0, 0.05]), "sume_connect": rng.choice([0.0, 0.01]),
        "events_refuse": rng.choice([0.0, 0.05]), "events_throttle": rng.choice([0.0, 0.05]),
        "events_timeout": rng.choice([0.0, 0.05]), "events_accept_timeout": rng.choice([0.0, 0.1, 0.3]),
        "index_lag": rng.choice([0.0, 0.1, 0.4]),
    }
    budget = {"crash": 2, "timeout": 2, "crash_step": 2, "ddb_throttle": 3, "sqs_throttle": 2, "sqs_entry_failed": 2,
              "sqs_duplicate": 3, "redis_lost_reply": 3, "s3_error": 2, "sume_connect": 3, "events_refuse": 2,
              "events_throttle": 2, "events_timeout": 2, "events_accept_timeout": 2, "index_lag": 1_000}
    return Plan(seed, jobs, env, sume, batch_size=rng.choice([1, 2, 4]), concurrency=concurrency, rates=rates,
                budget=budget, redis=redis, advance=rng.choice([0.01, 0.03, 0.08]),
                mode=rng.choice(["random", "priority"]))


def _job(rng: random.Random, webhook_kinds: list[str]) -> JobPlan:
    kind = rng.choice(KINDS)
    outcome = _weighted(rng, OUTCOMES)
    sim: dict[str, Any] = {"outcome": outcome, "duration": rng.choice([2, 5, 15, 40, 90]),
                           "steps": rng.choice([1, 2, 3])}
    if rng.random() < 0.3:
        sim["result_delay"] = rng.choice([5, 30, 60])
    faults = [rng.choice(TRANSIENT) for _ in range(rng.choice([0, 0, 1, 2]))]
    if rng.random() < 0.06:
        faults.insert(rng.randrange(len(faults) + 1), rng.choice(CLIENT_ERRORS))
    if faults:
        sim["faults"] = faults
    result_faults = [rng.choice(RESULT_FAULTS) for _ in range(rng.choice([0, 0, 0, 1]))]
    if rng.random() < 0.05:
        result_faults.insert(0, rng.choice(RESULT_REFUSALS))
    if result_faults:
        sim["result_faults"] = result_faults
    if rng.random() < 0.3:
        sim["not_found_for"] = rng.choice([3, 15])
    shape = _weighted(rng, (("object", 16), ("list", 2), ("string", 2), ("large", 1)))
    if shape != "object":
        sim["result_shape"] = shape
        if shape == "large":
            sim["result_bytes"] = 120_000
    if rng.random() < 0.1:
        sim["hints"] = False
    if rng.random() < 0.04:
        sim["forbidden"] = True
    if rng.random() < 0.06:
        sim["create_faults"] = [rng.choice(["slow:40000", "500", "429:3"])]
    register = rng.random() < 0.1
    again = rng.choice([None, None, None, None, 0.0, 5.0]) if not register else None
    return JobPlan(kind, sim, at=rng.choice([0.0, 0.0, 1.0, 10.0, 30.0]), register=register, again_after=again)


class Faults:
    """The faults the scheduler injects: each kind at its rate, at most its budget per run, drawn
    from the scheduler's RNG (so they are part of the schedule's choices)."""

    def __init__(self, rng: random.Random, rates: dict[str, float], budget: dict[str, int],
                 faultable: Any = lambda: True) -> None:
        self.rng = rng
        #: Whether the current actor may be faulted (not in the last tries of a message or an event).
        self.faultable = faultable
        self.rates = dict(rates)
        self.left = dict(budget)
        self.injected: dict[str, int] = {}
        self.enabled = True

    def take(self, kind: str) -> bool:
        rate = self.rates.get(kind, 0.0)
        if not self.enabled or rate <= 0 or self.left.get(kind, 0) <= 0 or not self.faultable():
            return False
        if self.rng.random() >= rate:
            return False
        self.left[kind] -= 1
        self.injected[kind] = self.injected.get(kind, 0) + 1
        return True

    def pick(self, group: str, options: tuple[str, ...]) -> str | None:
        """At most one of ``group_<option>`` faults, or None."""
        for option in options:
            if self.take(f"{group}_{option}"):
                return option
        return None

    def index_lag(self) -> float:
        return self.rng.choice([0.5, 2.0]) if self.take("index_lag") else 0.0

    def latency(self) -> float:
        return 0.0
