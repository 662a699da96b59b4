"""Sweeps on the whole system (in-process stack, TimeScale 0.02): the list route finishes jobs in
bulk beside the chains, a route that answers 404 sends every chain back to the normal schedule, and
a sweep leaves a job to its chain while the chain reads it. (Chains stretch only where sweeps
proved coverage: tests/unit/test_poller.py and test_discovery.py; list routes that do not behave as
assumed: test_sweeps_lists.py.)"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from invariants import Crash, check
from scenario import NO_CREATE_BUDGET, SAFE_LEASES, found_by, run, stack_fixtures, submit

from sume_poller.discovery.sweep import Sweeper
from tools.stack.base import wait_until
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

#: The sweeps' system parameters (test_sweeps_lists.py runs on the same).
PARAMETERS = {**NO_CREATE_BUDGET, "ReadsPerDay": 0, "SweepSafetySeconds": 600, "SweepCheckSeconds": 60,
              "SweepLagSeconds": 30}
LIST_CAPABLE = {"cursor": True, "order": "newest_first", "fields": "full"}
#: Chains read at most every 200 clock seconds here (a long schedule), so sweeps (every 50) find
#: jobs first where the list shows them.
ENV = {**SAFE_LEASES, "MIN_POLL_INTERVAL": "200"}
module_stack, stack = stack_fixtures(0.02, PARAMETERS, ENV)


def test_sweeps_finish_jobs_beside_chains_with_one_result_read_each(stack: InProcessStack) -> None:
    stack.sim.configure(list={**LIST_CAPABLE, "omit_kinds": ["video"]})  # so chains find the videos
    images = submit(stack, 30, lambda i: {"duration": 300 + 25 * i, "steps": 2, "hints": False})
    videos = submit(stack, 10, lambda i: {"duration": 300 + 25 * i, "steps": 2, "hints": False}, kind="video")
    ids = images + videos
    run(stack, ids, timeout=90)
    check(stack, ids, scenario="sweeps beside chains (list with cursor, newest first)", expected="completed",
          allowance=40)
    by = found_by(stack, ids)
    assert by["sweep"] > 0 and found_by(stack, videos) == {"chain": len(videos)}, (by, stack.metric_totals())
    jobs = stack.sim.stats()["jobs"]
    assert all(jobs[j]["result_reads"] == 1 for j in ids)  # one result read per job, whoever found it
    totals = stack.metric_totals()
    # only jobs of the kind the list omits can be misses (those chains found, a later sweep did not list)
    assert totals["SweepHandedOver"] == by["sweep"] and totals["SweepMiss"] <= len(videos)


def test_a_list_route_that_answers_404_sends_every_chain_back_to_the_normal_schedule(stack: InProcessStack) -> None:
    stack.sim.configure(list={"route": "missing"})
    ids = submit(stack, 24, {"duration": 300, "steps": 3})
    # A sweep while the jobs are pending, whatever the machine's speed (a loaded CI run finished the jobs
    # before a scheduled one ran): fan-out first counts them for the sweep's cost rule.
    stack.fanout()
    swept = stack.invoke("SweepFunction", {"source": "aws.events"})
    assert stack.metric_totals()["SweepRouteBroken"] >= 1, swept
    run(stack, ids)
    check(stack, ids, scenario="list route 404: chains only", expected="completed")
    totals = stack.metric_totals()
    assert totals["SweepRouteBroken"] >= 1 and totals["Outcome_stretched"] == 0
    assert found_by(stack, ids) == {"chain": len(ids)}


def test_a_sweep_leaves_a_job_to_its_chain_while_the_chain_reads_it(stack: InProcessStack) -> None:
    """The chain is mid-poll (it holds the claimed lease) when the sweep lists the job finished:
    one terminal write, one event, one result read."""
    stack.sim.configure(list=LIST_CAPABLE)
    ids = submit(stack, 24, {"duration": 1, "steps": 1, "hints": False})  # done by their first read
    stack.fanout()  # counts the pending jobs the sweep's cost rule needs
    swept: list[dict[str, Any]] = []
    once = threading.Lock()

    def sweep_during_the_read(step: str, job_id: str) -> None:
        # the chain just read a job Sume already finished, and still holds its claim
        if step == "read" and stack.sim.job_info(job_id)["terminal"] and once.acquire(blocking=False):  # type: ignore[index]
            redis.Redis.from_url(stack.redis_url).delete("sume:poll:!sweeps")  # no back-off from earlier sweeps
            swept.append(stack.invoke("SweepFunction", {"source": "aws.events"}))

    stack.step_hook = sweep_during_the_read
    run(stack, ids, fanout_every=3_600)  # no scheduled sweep: the chains read every job first
    check(stack, ids, scenario="a sweep and a chain on the same job at once", expected="completed", allowance=2)
    assert swept and swept[0]["left_to_chain"] >= 1, swept
    jobs = stack.sim.stats()["jobs"]
    twice = {j: {k: jobs[j][k] for k in ("status_reads", "result_reads")} for j in ids if jobs[j]["result_reads"] != 1}
    # (Failed twice in loaded CI runs, cause not found yet: the message says which jobs, how the sweep and the chains
    # found them and what the functions counted.)
    assert not twice, (twice, swept, dict(found_by(stack, ids)), stack.metric_totals())


def test_a_sweep_that_dies_mid_page_loses_nothing(stack: InProcessStack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep dies after handing three jobs of a page over, before their finishing messages
    went out: their chains find the lease handed over and stand down; once the hand-over lease
    runs out (the claim TTL), fan-out restarts those chains. Every job finishes once."""
    stack.sim.configure(list=LIST_CAPABLE)
    ids = submit(stack, 24, {"duration": 1, "steps": 1, "hints": False})
    stack.fanout()  # counts the pending jobs the sweep's cost rule needs
    handed: list[str] = []
    hand_over = Sweeper._hand_over

    def die_at_the_fourth(self: Sweeper, job_id: str, record: dict[str, Any], status: str) -> Any:
        if len(handed) == 3:
            raise Crash(job_id)
        held = hand_over(self, job_id, record, status)
        handed.append(job_id)
        return held

    monkeypatch.setattr(Sweeper, "_hand_over", die_at_the_fourth)
    with pytest.raises(Crash):
        stack.invoke("SweepFunction", {"source": "aws.events"})
    monkeypatch.undo()
    # only the chains' own messages (SQS's counts are approximate: moto's missed one moving from
    # delayed to visible in a loaded CI run - so the count is asked again until it shows them, a
    # second at most; each ask is a round trip to SQS, the loop's only wait)
    wait_until(lambda: stack.queue_depth() == len(ids), 1.0, lambda: f"{stack.queue_depth()} messages",
               lambda left: None)
    assert len(handed) == 3

    run(stack, ids, timeout=90)
    check(stack, ids, scenario="a sweep dies mid-page after three hand-overs", expected="completed", allowance=2)
    jobs = stack.sim.stats()["jobs"]
    assert all(jobs[j]["result_reads"] == 1 for j in ids)
