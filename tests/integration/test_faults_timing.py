"""Fault scenarios whose timing the fault suite's 50x clock would hide (there SQS's one-second delay
is 50 clock seconds, so a backoff of seconds is stretched past what it is meant to wait out): on a
10x clock (TimeScale 0.1), where a one-second delay is 10 clock seconds, as it is (roughly) on AWS."""

from __future__ import annotations

import pytest
from invariants import check
from scenario import NO_CREATE_BUDGET, SAFE_LEASES, run, stack_fixtures, submit

from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

module_stack, stack = stack_fixtures(0.1, {**NO_CREATE_BUDGET, "Sweeps": "false"}, SAFE_LEASES)


def test_a_result_ready_minutes_after_completion_is_fetched_whatever_the_route_answers_meanwhile(
        stack: InProcessStack) -> None:
    """Results ready 150 clock seconds after the job completed. Where the status says
    ``result_ready`` (and gives no hint of when) the wait reads the status and fetches each result
    once; where it says nothing of it, the wait reads the result route, whose not-ready answer - 404,
    409 or 425: Sume's contract does not say - is waited out. No job is recorded without its result."""
    groups: dict[int, tuple[list[str], list[str]]] = {}
    for not_ready in (404, 409, 425):
        late = {"duration": 10, "steps": 2, "result_delay": 150, "result_not_ready": not_ready}
        gated = submit(stack, 2, {**late, "hint_fields": ["terminal", "result_ready"]})
        ungated = submit(stack, 2, {**late, "hints": False})
        groups[not_ready] = (gated, ungated)
    ids = [j for gated, ungated in groups.values() for j in gated + ungated]
    run(stack, ids, timeout=90)
    # Without a hint of when, waiting 150 s on the result-phase backoff (5 s doubling) takes 5 reads.
    backoff = {j: 5 for gated, _ in groups.values() for j in gated}
    for not_ready, (gated, ungated) in groups.items():
        check(stack, gated + ungated, scenario=f"result ready 150 s after completion, not ready = {not_ready}",
              expected="completed", allowance=backoff, notes="gated: status read on a 5 s doubling backoff")
    jobs = stack.sim.stats()["jobs"]
    assert all(stack.record(j)["result_json"] for j in ids)  # type: ignore[index]
    gated_all = [j for gated, _ in groups.values() for j in gated]
    assert all(jobs[j]["result_reads"] == 1 for j in gated_all)  # the status said when: one result read each
    ungated_all = [j for _, ungated in groups.values() for j in ungated]
    assert all(jobs[j]["status_reads_after_terminal"] == 0 for j in ungated_all)  # the wait read the result route
