"""One schedule, start to end: its plan, the world, the scheduler's run, the invariants' verdict."""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field
from typing import Any

from .invariants import Checker, Violation
from .plan import Plan, draw
from .scheduler import Scheduler
from .world import START, EventSource, Every, IndexLag, Webhooks, World, deterministic, the_layers_aws

#: The clock runs on at most this long past the last job's deadline (then the run stops: "horizon").
HORIZON_AFTER_DEADLINE = 1_800.0


@dataclass
class Result:
    seed: int
    steps: int
    ended: str
    clock: float  # clock seconds the run covered
    violations: list[Violation]
    trace: str  # a digest of every step and the final state
    plan: Plan
    cpu: float
    faults: dict[str, int] = field(default_factory=dict)
    history: dict[str, list[tuple[float, str, str]]] = field(default_factory=dict)
    recent: list[tuple[float, str, str]] = field(default_factory=list)


def replay_command(seed: int) -> str:
    return f"make simulation SEED={seed}"


def run(seed: int, *, plan: Plan | None = None) -> Result:
    """Run schedule ``seed`` (its plan drawn from the seed unless given)."""
    started = time.process_time()
    plan = plan or draw(seed)
    sched = Scheduler(seed, START, advance=plan.advance, mode=plan.mode)
    with deterministic(seed, sched), contextlib.ExitStack() as stack:
        world = World(plan, sched)
        stack.enter_context(the_layers_aws(world))
        checker = Checker(world)
        sched.on_resume = world.on_resume
        sched.timeout = lambda: world.faults.take("timeout")
        _environment(world)
        deadline = max(j.at for j in plan.jobs) + float(plan.env["JOB_MAX_AGE_SECONDS"])
        ended = sched.run(until=lambda: _quiet(world), max_steps=plan.max_steps,
                          horizon=START + deadline + HORIZON_AFTER_DEADLINE)
        try:
            checker.finish(ended)
        finally:
            sched.unwind()
        sched.trace.update(_final_state(world).encode())
    return Result(seed, sched.steps, ended, sched.now - START, checker.violations, sched.trace.hexdigest(), plan,
                  time.process_time() - started, dict(world.faults.injected), dict(checker.history),
                  list(sched.recent))


def _environment(world: World) -> None:
    """What happens around the functions: the schedules, the event sources, Sume's webhooks, the
    submissions, Redis's outages and losses."""
    sched, plan = world.sched, world.plan
    sched.sources += [EventSource(world, world.poll_queue, "poll", plan.concurrency),
                      EventSource(world, world.create_queue, "submit", 2),
                      Every(world, "fanout", world.fanout_settings.period, sched.rng.uniform(0, 60), world.fanout_tick),
                      Webhooks(world), IndexLag(world)]
    if plan.env.get("SWEEPS") == "true":
        sched.sources.append(Every(world, "sweep", world.sweep_settings.period, sched.rng.uniform(0, 60),
                                   world.sweep_tick))
    world.submissions_left = 0
    for job in plan.jobs:
        world.submissions_left += 1 + (job.again_after is not None)
        sched.at(START + job.at, functools.partial(_submit, world, job))
    for at, kind, seconds in plan.redis:
        sched.at(START + at, functools.partial(_redis, world, kind, seconds))


def _redis(world: World, kind: str, seconds: float) -> None:
    world.sched.note_fault(f"redis {kind} {seconds:.0f}s")
    if kind == "outage":
        world.redis.outage(seconds)
    else:
        world.redis.lose_data(scripts=kind == "restart")


def _submit(world: World, job: Any) -> None:
    event: dict[str, Any] = {"kind": job.kind, "queue": job.queue}
    if job.register:
        event["job_id"] = world.model.seed_job(kind=job.kind, sim=job.sim)
    else:
        event["params"] = {"prompt": f"sim {world.plan.seed}", "sim": job.sim}
    world.submissions_left -= 1
    world.submit(event)
    if job.again_after is not None:
        world.sched.at(world.sched.now + job.again_after, lambda: _again(world, event))


def _again(world: World, event: dict[str, Any]) -> None:
    world.submissions_left -= 1
    world.submit(event)


def _quiet(world: World) -> bool:
    """Nothing left to do: no submission to come, no message, no invocation, every job terminal
    with its outbox done, no submission queued and no queue item left (one whose submission a
    duplicate settled leaves when a drain reads it), no webhook planned."""
    if world.submissions_left > 0 or world.pending_retries > 0 or any(world.running.values()):
        return False
    if any(q.messages for q in (world.poll_queue, world.create_queue)):
        return False
    if world.model.next_webhook_due() is not None:
        return False
    for key, item in world.ddb.tables["jobs"].items.items():
        status = item.get("status", {}).get("S")
        if (key.startswith("#sub:") and status == "queued") or key.startswith("#q:"):
            return False
        if not key.startswith("#") and (status == "pending" or "event_pending" in item):
            return False
    return True


def _final_state(world: World) -> str:
    items = world.ddb.tables["jobs"].items
    jobs = sorted((k, v.get("status", {}).get("S", "")) for k, v in items.items() if not k.startswith("#"))
    return f"records {jobs} events {[(e.job_id, e.detail.get('status')) for e in world.events.accepted]}"
