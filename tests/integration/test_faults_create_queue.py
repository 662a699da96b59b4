"""Fault rows of submissions that queue (issue 23, part 3), on the in-process stack (real
redis-server, moto server, the Sume simulator enforcing the key's create limits).

* A queued submission past its deadline is recorded ``rejected`` with ``create_budget_exhausted``
  and never created, then or later. The key's day budget is spent (3 creates a day, the simulator
  enforcing the same, Sume's 10 a minute), so what waits behind it cannot be created before its
  deadline (``SubmitQueueDeadlineSeconds`` at its minimum, 60 clock seconds).
* A drain step that fails after its create (before it settles the submission) is delivered again;
  the next create of that head replays its Idempotency-Key: one job, billed once.
* A drain that died (its message lost, its lease expired) is restarted by fan-out.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from scenario import FAST_LEASES, drain_running, settled, stack_fixtures, submission

from sume_poller.creates.createqueue import EXPIRED
from sume_poller.store.submissions import CREATED, REJECTED
from tools.stack.base import queue_depth
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

SCALE = 0.05
PER_DAY = 3
DEADLINE = 60
PARAMETERS = {"CreatesPerMinute": 10, "CreatesPerDay": PER_DAY, "SubmitQueueDeadlineSeconds": DEADLINE,
              "ReadsPerMinute": 0, "ReadsPerDay": 0}

module_stack, stack = stack_fixtures(SCALE, PARAMETERS, FAST_LEASES,
                                     sim_options={"create_budget": {"per_minute": 10, "per_day": PER_DAY}})


def event(i: int) -> dict[str, Any]:
    return {"kind": "image", "idempotency_key": f"fault-{i:04d}-{uuid.uuid4().hex[:8]}",
            "params": {"prompt": f"fault {i}", "sim": {"duration": 2}}}


def drain_idle(stack: InProcessStack) -> bool:
    """No drain runs (its lease is free) and no step of one waits in the create queue."""
    with redis.Redis.from_url(stack.redis_url) as rdb:
        free = not rdb.exists("sume:poll:!drain:default")
    return free and queue_depth(stack.client("sqs"), stack.outputs["CreateQueueUrl"]) == 0


def test_a_queued_submission_past_its_deadline_is_rejected_and_never_created(stack: InProcessStack) -> None:
    events = [event(i) for i in range(PER_DAY + 3)]
    from sume_poller.wiring import submit as wiring

    replies = [stack.submit(events[0])]
    with drain_running(stack):  # the rest queue, however slowly they arrive
        replies += [stack.submit(e) for e in events[1:]]
    assert wiring.submitter().start_drain("default", None)  # what the second's submit did, had no drain run
    keys = [e["idempotency_key"] for e in events]
    assert [r["status"] for r in replies] == ["submitted"] + ["queued"] * (len(events) - 1)
    # The estimate knows the day is spent after PER_DAY creates: those behind wait for the next day window.
    assert all(r["estimated_create_at"] > r["deadline_at"] for r in replies[PER_DAY:])

    stack.drive(lambda: settled(stack, keys), timeout=60, fanout_every=1.0)
    stack.drive(lambda: drain_idle(stack), timeout=30, fanout_every=1.0)
    stack.run_schedules()  # fan-out finds nothing left to restart

    records = [submission(stack, k) for k in keys]
    # Those behind the day's budget expire. Those within it are created - unless a machine slower than
    # the compressed clock let a deadline pass first; then they expire the same way, never asked.
    assert records[0]["status"] == CREATED and all(r["status"] == REJECTED for r in records[PER_DAY:])
    created = [r for r in records if r["status"] == CREATED]
    expired = [r for r in records if r["status"] != CREATED]
    assert len(expired) >= 3 and len(created) + len(expired) == len(records)
    for record in expired:
        assert record["status"] == REJECTED and record["error"]["code"] == EXPIRED == "create_budget_exhausted"
        assert record["settled_at"] >= record["deadline_at"] and record["job_ids"] == []
    stats = stack.sim.stats()
    # Never created: not even asked. A create a loaded machine sent again came with its Idempotency-Key.
    assert stats["creates"] == len(created) and stats["create_requests"] == len(created) + stats["replays"]
    assert stack.metric_totals()["SubmissionsExpired"] == len(expired)
    assert drain_idle(stack) and stack.table.pending_page("q:default", None)[0] == []

    again = stack.submit(events[-1])  # a replay of an expired one: answered from the table
    assert (again["status"], again["error"], again["replayed"]) == ("rejected", EXPIRED, True)
    assert stack.sim.stats()["create_requests"] == stats["create_requests"]  # not asked of Sume


def test_fan_out_restarts_a_drain_that_died(stack: InProcessStack) -> None:
    events = [event(i) for i in range(3)]
    replies = [stack.submit(events[0])]
    with drain_running(stack):  # a drain that dies: no message of it left, its lease gone when it ends
        replies += [stack.submit(e) for e in events[1:]]
    assert [r["status"] for r in replies] == ["submitted", "queued", "queued"]
    assert queue_depth(stack.client("sqs"), stack.outputs["CreateQueueUrl"]) == 0

    report = stack.fanout()
    assert report["drains_started"] == 1
    assert stack.fanout()["drains_started"] == 0  # one drain per key: the next tick finds it running

    keys = [e["idempotency_key"] for e in events]
    stack.drive(lambda: settled(stack, keys), timeout=60, fanout_every=1.0)
    # The restarted drain settles every queued submission in arrival order: created, or - where a slow machine let its
    # 60 clock s (3 real s here) queue deadline pass before the drain reached it - expired, never asked (a clean-clone
    # CI run with one core busy expired the third; the deadline itself is the test above's).
    records = [submission(stack, k) for k in keys]
    created = [r["job_ids"][0] for r in records if r["status"] == CREATED]
    expired = [r for r in records if r["status"] != CREATED]
    assert records[0]["status"] == CREATED and all(r["status"] == REJECTED and r["error"]["code"] == EXPIRED
                                                   for r in expired), records
    assert [j for j in stack.sim.stats()["jobs"] if j in created] == created
    assert stack.sim.stats()["creates"] == len(created)


# A second stack: creates that Sume takes and answers later than the queue deadline (a 5 s real read
# timeout, as long as the 100 clock s deadline on this 20x clock; the claim TTL above it), and a create
# budget of 3 a minute (one grant a minute: a second submission right after the first queues). Its tests
# come after every test of the first stack: both stacks share the worker's moto server, and starting the
# second provisions the template again there (the first one's queues are gone then).
SLOW_ENV = {**FAST_LEASES, "SUME_READ_TIMEOUT": "5", "CLAIM_TTL_SECONDS": "8"}
module_slow_stack, slow_stack = stack_fixtures(
    SCALE, {**PARAMETERS, "CreatesPerMinute": 3, "CreatesPerDay": 0, "SubmitQueueDeadlineSeconds": 100}, SLOW_ENV,
    name="slow_stack", sim_options={"create_budget": {"per_minute": 10}})


def test_a_queued_submission_whose_create_outcome_is_unknown_at_its_deadline_is_replayed_and_ends_known(
        slow_stack: InProcessStack) -> None:
    """The queue's head is created at Sume, but the answer comes after the client gave up - past the
    submission's deadline. Before: recorded rejected at the deadline (``unknown_attempts``), a job Sume
    billed that nobody watched. Now its create is replayed once with the same Idempotency-Key (a create
    slot ahead of the queue) before it is rejected: Sume returns the job, which is watched to its end."""
    stack = slow_stack
    first, slow = event(0), event(1)
    slow["params"]["sim"] = {"duration": 2, "create_faults": ["slow:7000"]}  # created at once, answered in 7 s
    assert [stack.submit(first)["status"], stack.submit(slow)["status"]] == ["submitted", "queued"]
    stack.drive(lambda: settled(stack, [slow["idempotency_key"]]), timeout=60, fanout_every=1.0)
    record = submission(stack, slow["idempotency_key"])
    assert record["status"] == CREATED and record["replayed"] is True and len(record["job_ids"]) == 1
    assert record["settled_at"] >= record["deadline_at"]  # the first attempt's answer never came in time
    stats = stack.sim.stats()
    assert (stats["creates"], stats["replays"]) == (2, 1)  # billed once: the replay returned the same job
    job_id = record["job_ids"][0]
    stack.drive(lambda: stack.settled([job_id]), timeout=60, fanout_every=1.0)
    assert stack.record(job_id)["status"] == "completed"  # type: ignore[index]


def test_a_drain_step_dying_after_a_create_of_unknown_outcome_leaves_the_evidence_on_the_record(
        slow_stack: InProcessStack) -> None:
    """The queue's head is created at Sume but answered after the client gave up, and the step dies
    before it re-queues itself: its message's count of failed creates is lost with it, and the drain
    that fan-out restarts reads the head at its deadline. The create was noted on the submission
    record before it was sent, so the head's create is replayed with its Idempotency-Key and the job
    Sume billed is watched. Before: rejected at the deadline without a replay, a billed job nobody
    watched."""
    from sume_poller.wiring import submit as wiring

    stack = slow_stack
    first, slow = event(0), event(1)
    slow["params"]["sim"] = {"duration": 2, "create_faults": ["slow:7000"]}  # created at once, answered in 7 s
    assert [stack.submit(first)["status"], stack.submit(slow)["status"]] == ["submitted", "queued"]
    drainer = wiring.drainer()
    rest, died = drainer._next, []

    def die_once(*args: Any, **kwargs: Any) -> None:
        if not died and kwargs.get("errors"):  # the step after the create that got no answer
            died.append(kwargs["errors"])
            raise RuntimeError("injected: the step dies after its create, before it re-queues itself")
        rest(*args, **kwargs)

    drainer._next = die_once  # type: ignore[method-assign]
    try:
        stack.drive(lambda: settled(stack, [slow["idempotency_key"]]), timeout=90, fanout_every=1.0)
    finally:
        del drainer._next  # the class's method again
    assert died == [1], "the fault was injected"
    record = submission(stack, slow["idempotency_key"])
    assert record["status"] == CREATED and record["replayed"] is True and len(record["job_ids"]) == 1
    assert record["settled_at"] >= record["deadline_at"] and record["create_attempts"] == 2
    assert stack.metric_totals().get("CreateReplays", 0) >= 1  # the replay at the deadline, not a plain retry
    stats = stack.sim.stats()
    assert (stats["creates"], stats["replays"]) == (2, 1)  # billed once: the replay returned the same job
    job_id = record["job_ids"][0]
    stack.drive(lambda: stack.settled([job_id]), timeout=60, fanout_every=1.0)
    assert stack.record(job_id)["status"] == "completed"  # type: ignore[index]


def test_a_drain_step_failing_after_its_create_is_billed_once(slow_stack: InProcessStack) -> None:
    """On the slow stack: no day budget, so a create sent again by a loaded machine (an answer past the
    read timeout, a step past its claim) takes no slot the injected replay needs."""
    from sume_poller.wiring import submit as wiring

    stack = slow_stack
    events = [event(i) for i in range(2)]
    replies = [stack.submit(events[0])]
    with drain_running(stack):  # the second queues, however slowly it arrives
        replies.append(stack.submit(events[1]))
    assert [r["status"] for r in replies] == ["submitted", "queued"]
    assert wiring.submitter().start_drain("default", None)  # what its submit did, had no drain been running
    store = wiring.drainer().store
    settle, failed = store.settle_submission, []

    def fail_once(*args: Any, **kwargs: Any) -> bool:
        if not failed:
            failed.append(args)
            raise RuntimeError("injected: the step dies after its create, before it settles")
        return settle(*args, **kwargs)

    store.settle_submission = fail_once  # type: ignore[method-assign]
    try:
        keys = [e["idempotency_key"] for e in events]
        stack.drive(lambda: settled(stack, keys), timeout=60, fanout_every=1.0)
    finally:
        del store.settle_submission  # the class's method again
    assert failed, "the fault was injected"
    stats = stack.sim.stats()
    # The failed step's head was created again with its Idempotency-Key: Sume replayed it (and any other
    # create a loaded machine sent again), billing each submission once.
    assert stats["creates"] == 2 and stats["replays"] >= 1 and stats["create_requests"] == 2 + stats["replays"]
    records = [submission(stack, e["idempotency_key"]) for e in events]
    assert all(r["status"] == CREATED for r in records)
    assert len({j for r in records for j in r["job_ids"]}) == 2
    assert len(stack.records()) == 2  # two jobs watched, none twice
