"""The learned schedule's observations on the whole system (in-process stack): recorded once per
job whatever crashes. (Reads placed by the fitted model: test_schedule_learned.py.)"""

from __future__ import annotations

import pytest
from invariants import Crash, check
from scenario import SAFE_LEASES, SCHEDULE_PARAMETERS, SCHEDULE_SCALE, observations, stack_fixtures, submit

from sume_poller.store.records import stats_slot
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

ENV = {**SAFE_LEASES, "CLAIM_TTL_SECONDS": "4", "SUME_READ_TIMEOUT": "1"}  # a crashed claim is retried soon
module_stack, stack = stack_fixtures(SCHEDULE_SCALE, SCHEDULE_PARAMETERS, ENV)


def videos(stack: InProcessStack, durations: list[float]) -> list[str]:
    return submit(stack, len(durations), lambda i: {"duration": durations[i], "hints": False}, kind="video")




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
