"""The shared read budget on the whole system (in-process stack): 30 jobs against a Sume that allows
the key 40 reads a minute, on a compressed clock (TimeScale 0.1: a clock minute is 6 real seconds,
so SQS's one-second delays stay small against Sume's minute windows, as they are on AWS)."""

from __future__ import annotations

import pytest
from invariants import check
from scenario import NO_CREATE_BUDGET, SAFE_LEASES, stack_fixtures, submit

from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

SCALE = 0.1
LIMIT = 40
PARAMETERS = {**NO_CREATE_BUDGET, "ReadsPerMinute": LIMIT, "ReadsPerDay": 0}


module_stack, stack = stack_fixtures(SCALE, PARAMETERS, SAFE_LEASES,
                                     sim_options={"read_budget": {"per_minute": LIMIT, "per_day": None}})


def windows(stack: InProcessStack) -> list[dict[str, int]]:
    return [w for w in stack.sim.budget_stats()["reads"]["60"] if w["attempts"]]


@pytest.mark.parametrize("other_share", [0.0, 0.1], ids=["alone", "with another client of the key"])
def test_every_job_finishes_with_its_result_inside_the_budget(stack: InProcessStack, other_share: float) -> None:
    stack.sim.configure(other_consumer_share=other_share)
    ids = submit(stack, 30, {"duration": 30, "steps": 2, "hints": False})
    stack.drive(lambda: stack.settled(ids), 120, fanout_every=1.0)
    other = ", another client takes 10 %" if other_share else ""
    verdict = check(stack, ids, scenario=f"read budget binds ({LIMIT}/min){other}", expected="completed",
                    allowance=100)
    jobs = stack.sim.stats()["jobs"]
    after = {j: (jobs[j], stack.record(j)) for j in ids if jobs[j]["status_reads_after_terminal"]}
    assert not after, f"status reads after a terminal one: {after}"
    assert all(stack.record(j)["result_json"] for j in ids)  # type: ignore[index]
    attempts = sum(w["attempts"] for w in windows(stack))
    refused = sum(w["refused"] for w in windows(stack))
    assert refused / attempts < 0.01, (refused, attempts)
    assert max(w["attempts"] for w in windows(stack)) <= LIMIT  # ours; the other client is Sume's business
    verdict.extra.update(attempts=attempts, refused=refused)
