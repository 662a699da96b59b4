"""The learned schedule on the whole system (in-process stack): observations recorded once per job
whatever crashes, and reads placed by the fitted model through the real poll handler."""

from __future__ import annotations

import math
import random

import pytest
from invariants import Crash, check
from scenario import NO_CREATE_BUDGET, SAFE_LEASES, stack_fixtures, submit

from sume_poller.store import STATS_PREFIX, stats_slot
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

#: 10x fast, with no read budget: the handlers keep up with the schedule even on a busy machine,
#: so the reads counted are the schedule's, not a backlog's.
SCALE = 0.1
PARAMETERS = {**NO_CREATE_BUDGET, "ReadsPerMinute": 0, "ReadsPerDay": 0}


ENV = {**SAFE_LEASES, "CLAIM_TTL_SECONDS": "4", "SUME_READ_TIMEOUT": "1"}  # a crashed claim is retried soon
module_stack, stack = stack_fixtures(SCALE, PARAMETERS, ENV)


def videos(stack: InProcessStack, durations: list[float]) -> list[str]:
    return submit(stack, len(durations), lambda i: {"duration": durations[i], "hints": False}, kind="video")



def observations(stack: InProcessStack, profile: str) -> dict[str, object]:
    item = stack.table.get(STATS_PREFIX + profile) or {}
    return {k: v for k, v in item.items() if k.startswith("o")}


def test_a_crash_between_the_terminal_write_and_the_statistics_loses_nothing_and_counts_once(
        stack: InProcessStack) -> None:
    ids = videos(stack, [60, 80, 100, 120])
    crashed: set[str] = set()

    def crash_after_the_write(step: str, job_id: str) -> None:
        if step == "written" and job_id not in crashed:
            crashed.add(job_id)
            raise Crash(job_id)

    stack.step_hook = crash_after_the_write
    stack.drive(lambda: stack.settled(ids), 60, fanout_every=1.0)
    check(stack, ids, scenario="crash between the terminal write and the statistics update", allowance=2,
          expected="completed")
    assert crashed == set(ids)
    slots = {stats_slot(j) for j in ids}  # ids may share a slot: the newest job in it wins
    assert len(observations(stack, "video")) == len(slots)  # the outbox retry wrote each again, in place
    for slot in observations(stack, "video").values():
        assert 0 <= slot["l"] <= slot["u"]  # type: ignore[index,operator]


def test_the_learned_schedule_places_reads_through_the_real_handler(stack: InProcessStack) -> None:
    """40 images of about 100 clock seconds teach the model; the next 20 are read by it: fewer
    reads than the static schedule (2, 3, 5, 8, 13, 20, 30 s) spends on the same jobs, all found."""
    rng = random.Random(7)
    durations = [100 * math.exp(rng.gauss(0, 0.4)) for _ in range(60)]
    teach = submit(stack, 40, lambda i: {"duration": durations[i], "hints": False})
    stack.drive(lambda: stack.settled(teach), 120, fanout_every=1.0)
    static_reads = sum(s["status_reads"] for j, s in stack.sim.stats()["jobs"].items() if j in teach) / len(teach)
    assert len(observations(stack, "image")) >= 30
    learned = submit(stack, 20, lambda i: {"duration": durations[40 + i], "hints": False})
    stack.drive(lambda: stack.settled(learned), 120, fanout_every=1.0)
    jobs = stack.sim.stats()["jobs"]
    learned_reads = sum(jobs[j]["status_reads"] for j in learned) / len(learned)
    check(stack, learned, scenario="learned schedule through the poll handler", expected="completed", allowance=50,
          notes=f"{learned_reads:.1f} status reads/job vs {static_reads:.1f} on the static schedule")
    assert learned_reads < 0.8 * static_reads, (learned_reads, static_reads)
