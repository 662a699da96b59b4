"""The deadline's last read, on the whole system (in-process stack: real handlers, redis-server, moto
server, the Sume simulator) on a 10x clock with the shortest JobMaxAgeSeconds (60 clock seconds): every
wait is clamped to the deadline, and the step at the deadline reads once more - the status, or the
result where Sume said it is ready - and records what it finds instead of ``timed_out`` blind."""

from __future__ import annotations

import pytest
from invariants import check
from scenario import NO_CREATE_BUDGET, SAFE_LEASES, run, stack_fixtures, submit

from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

MAX_AGE = 60
module_stack, stack = stack_fixtures(0.1, {**NO_CREATE_BUDGET, "Sweeps": "false", "JobMaxAgeSeconds": MAX_AGE},
                                     SAFE_LEASES)


def test_a_result_that_becomes_ready_in_the_final_wait_is_fetched_and_a_running_job_is_recorded_as_read(
        stack: InProcessStack) -> None:
    """Completed at 10 s, its result ready at 59 s (the status says ``result_ready`` and gives no hint of
    when): the waits (5 s doubling) step over 59 s to the deadline, where the last read finds it ready and
    fetches it. Before: recorded timed_out at the deadline without a read, though the result was paid for.
    A job still running at the deadline is recorded timed_out with the status its last read found."""
    ready_late = submit(stack, 3, {"duration": 10, "steps": 1, "result_delay": MAX_AGE - 11,
                                   "hint_fields": ["terminal", "result_ready"]})
    running = submit(stack, 2, {"duration": 100_000, "steps": 3})
    run(stack, ready_late + running, timeout=60)
    check(stack, ready_late, scenario="a result ready 1 s before the deadline", expected="completed",
          allowance=5, notes="the result-phase waits read the status, the last one at the deadline")
    jobs = stack.sim.stats()["jobs"]
    for job_id in ready_late:
        record = stack.record(job_id)
        assert record is not None and record["result_json"] and record["evidence"] == "result_read"
        assert jobs[job_id]["result_reads"] == 1
    for job_id in running:
        record = stack.record(job_id)
        assert record is not None and (record["status"], record["evidence"]) == ("timed_out", "deadline")
        assert record["sume_status"] in ("queued", "running", "processing")  # what the last read found
        assert record["status_reads"] == jobs[job_id]["status_reads"]  # every read counted, the last one too
        assert record["terminal_at"] >= record["deadline_at"]
