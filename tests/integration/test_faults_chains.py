"""The fault suite, chains: a poller dying at each step, every message delivered twice, stale copies
of old steps - on the whole system (in-process stack: real handlers, redis-server, moto server, the
Sume simulator) on a compressed clock (TimeScale 0.02: a clock minute lasts 1.2 real seconds).
After each scenario :func:`invariants.check` verifies the whole promise and records a figures row.
Leases here free 2 real seconds after a crash; SQS's visibility timeout after a crashed invocation
(180 s in the template, above the claim's TTL) is fast-forwarded once the claim has expired."""

from __future__ import annotations

import time
from typing import Any

import pytest
from invariants import Crash, check
from scenario import CLAIM_TTL_REAL, FAULT_JOBS, FAULT_SCALE, fault_suite_fixtures, run, status_reads, submit

from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

SCALE, JOBS = FAULT_SCALE, FAULT_JOBS
module_stack, stack = fault_suite_fixtures()


# == crashes, duplicates, stale copies ==========================================================
@pytest.mark.parametrize("step", ["claimed", "read", "rested", "result", "written", "published", "released",
                                  "sent"])
def test_a_poller_dying_at_any_step_loses_nothing(stack: InProcessStack, step: str) -> None:
    """Each job's poller dies once, at ``step``; the batch is delivered again only after the claim
    expired (as SQS's visibility timeout does), and fan-out restarts chains whose lease ran out."""
    # A job's first status read says it runs, whatever the machine's speed (a slow first read could
    # find it done and never re-queue it: no job reached 'sent' in a CI run under load). 'rested' and
    # 'sent' are both steps of a re-queue only.
    running = {"status_override": {"status": "running", "reads": 1}} if step in ("rested", "sent") else {}
    ids = submit(stack, 10, {"duration": 150, "steps": 2, **running})
    crashed: set[str] = set()

    def hook(name: str, job_id: str) -> None:
        if name == step and job_id not in crashed:
            crashed.add(job_id)
            raise Crash(f"{step} {job_id}")

    stack.step_hook = hook
    stack.fast_retry = False
    waiting: list[tuple[float, list[dict[str, Any]]]] = []
    deadline = time.monotonic() + 90
    next_tick = time.monotonic()
    while not stack.settled(ids):
        assert time.monotonic() < deadline, stack.pending_summary(ids)
        if time.monotonic() >= next_tick:
            stack.run_schedules()
            next_tick = time.monotonic() + 1.0
        for at, messages in [w for w in waiting if w[0] <= time.monotonic()]:
            stack.make_visible(messages)
            waiting.remove((at, messages))
        messages = stack.receive()
        if messages and stack.deliver(messages).crash is not None:
            waiting.append((time.monotonic() + CLAIM_TTL_REAL + 0.5, messages))
        elif not messages:
            time.sleep(0.05)
    assert crashed, f"no job reached {step}"
    check(stack, ids, scenario=f"poller dies at '{step}'", allowance=2,
          notes=f"{len(crashed)} crashes; recovered by redelivery after the claim TTL and by fan-out")


def test_every_message_delivered_twice_costs_no_read(stack: InProcessStack) -> None:
    ids = submit(stack, JOBS, {"duration": 150, "steps": 3})
    run(stack, ids, duplicate=True)
    check(stack, ids, scenario="every message delivered twice")
    assert stack.outcomes["contention"] > 0


def test_a_stale_copy_of_an_old_step_reads_nothing(stack: InProcessStack) -> None:
    ids = submit(stack, 5, {"duration": 250, "steps": 4})
    bodies: list[str] = []
    deadline = time.monotonic() + 60
    while len(bodies) < 10:
        assert time.monotonic() < deadline, f"{len(bodies)} steps delivered"
        messages = stack.receive()
        bodies += [m["Body"] for m in messages]
        if messages:
            stack.deliver(messages)
    for body in bodies:  # every old step comes back, long after its chain moved on
        stack.send(body)
    delivered = stale_reads = 0
    while delivered < len(bodies):  # the stale copies in batches of their own, the chains' own steps beside them
        assert time.monotonic() < deadline, f"{delivered} of {len(bodies)} stale copies delivered"
        messages = stack.receive()
        stale = [m for m in messages if m["Body"] in bodies]
        if own := [m for m in messages if m["Body"] not in bodies]:
            stack.deliver(own)
        if stale:
            reads = status_reads(stack, ids)
            stack.deliver(stale)
            stale_reads += status_reads(stack, ids) - reads
            delivered += len(stale)
    assert stale_reads == 0  # a stale copy reads nothing (the deliveries above run on this thread alone)
    run(stack, ids)
    check(stack, ids, scenario="stale copies of old steps", notes=f"{len(bodies)} stale copies dropped")
