"""Scenarios about long spans of time, on a strongly compressed clock (TimeScale 0.0025: a clock
hour lasts 9 real seconds; SQS's one-second delay is 400 clock seconds)."""

from __future__ import annotations

import pytest
from invariants import check
from scenario import NO_CREATE_BUDGET, SAFE_LEASES, stack_fixtures, submit

from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

SCALE = 0.0025
PARAMETERS = {**NO_CREATE_BUDGET, "JobMaxAgeSeconds": 5_400}


module_stack, stack = stack_fixtures(SCALE, PARAMETERS, SAFE_LEASES)


def test_a_result_ready_forty_minutes_after_completion_is_fetched_without_status_reads(stack: InProcessStack) -> None:
    """The job completes after 10 clock minutes; its result becomes ready 40 minutes later. The
    chain waits in the result phase with a growing backoff: never timed out, never another status
    read, a bounded number of result fetches."""
    ids = submit(stack, 6, {"duration": 600, "steps": 2, "result_delay": 2_400, "hints": False}, kind="video")
    stack.drive(lambda: stack.settled(ids), 60, fanout_every=1.0)
    check(stack, ids, scenario="result ready 40 min after completion", expected="completed", allowance=2)
    jobs = stack.sim.stats()["jobs"]
    assert all(jobs[j]["status_reads_after_terminal"] == 0 for j in ids)
    fetches = [jobs[j]["result_reads"] for j in ids]
    assert max(fetches) <= 12, fetches  # a backoff, not a read every few seconds for 40 minutes


def test_a_far_hint_never_outlives_the_deadline(stack: InProcessStack) -> None:
    """Sume hints a next read days away; the job is recorded timed_out at its deadline (1.5 clock
    hours), with one read."""
    ids = submit(stack, 2, {"duration": 10**7, "steps": 1})
    stack.drive(lambda: stack.settled(ids), 60, fanout_every=1.0)
    check(stack, ids, scenario="a hint days away vs a 1.5 h deadline", expected="timed_out")
    assert all(stack.record(j)["error"]["code"] == "deadline_exceeded" for j in ids)  # type: ignore[index]
