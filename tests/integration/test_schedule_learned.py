"""Reads placed by the learned schedule's fitted model through the real submit and poll handlers
(in-process stack): once a kind has enough observations, its jobs' reads follow the model, all
found, each once. How many reads that saves over the static schedule is bench figure 7's (a
virtual clock: here SQS delays are whole real seconds and a busy machine adds lag to both
schedules); the poller recording the observations is test_schedule_system's."""

from __future__ import annotations

import math
import random

import pytest
from invariants import check
from scenario import SAFE_LEASES, SCHEDULE_PARAMETERS, SCHEDULE_SCALE, stack_fixtures, submit

from sume_poller.schedule.models import ModelCache
from sume_poller.schedule.planner import SHORT_SCHEDULE
from sume_poller.store.records import JobStore
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

module_stack, stack = stack_fixtures(SCHEDULE_SCALE, SCHEDULE_PARAMETERS, SAFE_LEASES)

#: Clock seconds: the jobs' median duration. The learned plan's first read of a log-normal kind
#: lands near 0.6-0.7 of its median (schedule.learned_plan), the static schedule's at 2 s.
MEDIAN = 60.0


def test_the_learned_schedule_places_reads_through_the_real_handler(stack: InProcessStack) -> None:
    """Images have 45 observations, recorded as the poller's outbox records them (each seen
    running, then finished); the next 16 are read by the fitted model: no first read before 0.4 of
    the median (the static schedule reads at 2 s, and a busy machine only makes reads later), all
    found, each once, within the read allowance."""
    rng = random.Random(7)
    store = JobStore(stack.outputs["JobsTableName"], 1)
    for i in range(45):
        duration = MEDIAN * math.exp(rng.gauss(0, 0.3))
        store.put_observation("image", f"job_seen_{i:02d}", 0.9 * duration, 1.05 * duration, stack.clock.now())
    fitted = ModelCache(store, stack.clock.now).describe("image")
    assert "median" in fitted, fitted  # the model the containers' submit and poll will fit
    learned = submit(stack, 16, lambda i: {"duration": MEDIAN * math.exp(rng.gauss(0, 0.3)), "hints": False})
    stack.drive(lambda: stack.settled(learned), 120, fanout_every=1.0)
    jobs = stack.sim.stats()["jobs"]
    first_reads = sorted(jobs[j]["first_read_age"] for j in learned)
    learned_reads = sum(jobs[j]["status_reads"] for j in learned) / len(learned)
    check(stack, learned, scenario="learned schedule through the poll handler", expected="completed", allowance=50,
          notes=f"{learned_reads:.1f} status reads/job; first reads at {first_reads[0]:.0f}-{first_reads[-1]:.0f} "
                f"clock s (median duration {MEDIAN:g} s)")
    assert SHORT_SCHEDULE[0] < 0.4 * MEDIAN <= first_reads[0], first_reads
