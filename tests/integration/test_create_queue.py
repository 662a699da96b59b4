"""Submissions that queue (issue 23, part 3) on the in-process stack: real redis-server, moto server
and the Sume simulator enforcing Sume's documented create limits (10 a minute, 300 a day), the
template's create budget at the same limits.

A burst on one key: none refused, each created once, in arrival order, a 402 recorded final, a
replay answered from the table without the create budget; a duplicate submitted while the first
is still queued is the same submission (one create).
"""

from __future__ import annotations

import time
import uuid
from itertools import pairwise
from typing import Any

import pytest
import redis
from scenario import FAST_LEASES, drain_running, settled, stack_fixtures, submission

from sume_poller.limits.budget import MINUTE, NO_DAY_RESERVE, Budget, granted_per_window
from sume_poller.store.submissions import CREATED, REJECTED
from tools.stack.base import wait_until
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

#: 20x fast: a create slot (7.5 clock s) is under a real second, so each queued create waits for
#: SQS's one-second DelaySeconds (the in-process stack's floor): a burst of BURST takes ~BURST s.
SCALE = 0.05
BURST = 14
CREATE_LIMITS = {"per_minute": 10, "per_day": 300}
PARAMETERS = {"CreatesPerMinute": 10, "CreatesPerDay": 300, "ReadsPerMinute": 0, "ReadsPerDay": 0}
CREATE_BUDGET = "sume:poll:!budget:{creates}"

module_stack, stack = stack_fixtures(SCALE, PARAMETERS, FAST_LEASES, sim_options={"create_budget": CREATE_LIMITS})


def event(i: int, **sim: Any) -> dict[str, Any]:
    return {"kind": "image", "idempotency_key": f"burst-{i:04d}-{uuid.uuid4().hex[:8]}",
            "params": {"prompt": f"burst {i}", "sim": {"duration": 2, **sim}}}


def create_429s(stack: InProcessStack) -> int:
    return sum(w["creates"]["rate_limited"] for w in stack.sim.stats()["keys"].values())


def test_a_burst_is_queued_not_refused_and_created_once_each_in_arrival_order(stack: InProcessStack) -> None:
    events = [event(i, **({"insufficient_credits": True} if i == 5 else {})) for i in range(BURST)]
    replies = [stack.submit(events[0])]
    with drain_running(stack):
        replies += [stack.submit(e) for e in events[1:]]  # none raises CreateBudgetExhausted: 0 refused
    keys = [e["idempotency_key"] for e in events]

    assert replies[0]["status"] == "submitted" and replies[0]["new"]  # the budget's free slot: created at once
    queued = replies[1:]
    assert [r["status"] for r in queued] == ["queued"] * len(queued), queued
    assert [r["idempotency_key"] for r in queued] == keys[1:]
    # Each queued submission is estimated one create slot after the one before it, whatever the time
    # between their arrivals: the next free slot does not move back while nothing is created, and each
    # has one more ahead of it (estimates are rounded up to whole seconds: 1 s of slack per gap).
    estimates = [r["estimated_create_at"] for r in queued]
    slot = MINUTE / granted_per_window(PARAMETERS["CreatesPerMinute"])
    gaps = [b - a for a, b in pairwise(estimates)]
    assert all(gap >= slot - 1 for gap in gaps), (slot, gaps)
    assert all(r["deadline_at"] >= r["estimated_create_at"] for r in queued)

    stack.drive(lambda: settled(stack, keys), timeout=120, fanout_every=1.0)

    records = [submission(stack, k) for k in keys]
    assert [r["status"] for r in records] == [REJECTED if i == 5 else CREATED for i in range(BURST)]
    rejected = records[5]
    assert rejected["error"]["code"] == "insufficient_credits" and rejected["http_status"] == 402
    stats = stack.sim.stats()
    assert stats["creates"] == BURST - 1 and stats["insufficient_credits"] == 1  # 402: asked once, never again
    # None created twice (the count above), Sume never throttled a create. A create may be sent again with its
    # Idempotency-Key - the contract's replay, which returns the job the first one made - where the first one's
    # answer came after the 1 s read timeout here or its drain step outlived its 2 s lease: what a loaded machine
    # does, so no count of replays is held here (bench figure 11 counts them on a virtual clock: 0).
    assert create_429s(stack) == 0
    assert stats["jobs_created"] == BURST - 1, stats
    # Arrival order: the simulator's jobs in the order they were created are the submissions' order.
    created = [r["job_ids"][0] for r in records if r["status"] == CREATED]
    assert [j for j in stats["jobs"] if j in set(created)] == created
    # Every created job is watched: recorded pending (or finished) with its submission's key.
    jobs = stack.table.get_many(created)
    assert {jobs[j]["idempotency_key"] for j in created} == {k for i, k in enumerate(keys) if i != 5}
    assert stack.table.pending_page("q:default", None)[0] == []  # the queue is empty

    # A replay of a created submission and of the 402 answers from the table: no create, no budget.
    with redis.Redis.from_url(stack.redis_url, decode_responses=True) as rdb:
        budget_before = rdb.hgetall(CREATE_BUDGET)
        again, refused_again = stack.submit(events[3]), stack.submit(events[5])
        assert rdb.hgetall(CREATE_BUDGET) == budget_before
    assert again["status"] == "submitted" and again["replayed"] is True and again["job_ids"] == records[3]["job_ids"]
    assert refused_again["status"] == "rejected" and refused_again["error"] == "insufficient_credits"
    assert refused_again["replayed"] is True
    assert stack.sim.stats()["create_requests"] == stats["create_requests"]
    totals = stack.metric_totals()
    assert totals["SubmissionsQueued"] == BURST - 1 and totals["SubmissionsCreatedFromQueue"] == BURST - 2
    assert totals["SubmissionsExpired"] == 0


def test_a_duplicate_submitted_while_the_first_is_queued_is_the_same_submission(stack: InProcessStack) -> None:
    events = [event(i) for i in range(4)]
    first = [stack.submit(events[0])]
    with drain_running(stack):
        first += [stack.submit(e) for e in events[1:]]
        assert [r["status"] for r in first] == ["submitted", "queued", "queued", "queued"]
        duplicate = stack.submit(events[3])  # still queued behind two others
    assert duplicate["status"] == "queued" and duplicate["replayed"] is True
    assert duplicate["idempotency_key"] == events[3]["idempotency_key"]
    assert duplicate["deadline_at"] == first[3]["deadline_at"]
    assert len(stack.table.pending_page("q:default", None)[0]) == 3  # no second queue item

    keys = [e["idempotency_key"] for e in events]
    stack.drive(lambda: settled(stack, keys), timeout=60, fanout_every=1.0)
    stats = stack.sim.stats()
    # One create billed each; a create a loaded machine sent again (an answer past the 1 s read timeout) came
    # with its Idempotency-Key and was replayed.
    assert stats["creates"] == 4 and stats["create_requests"] == 4 + stats["replays"], stats
    after = stack.submit(events[3])
    assert after["status"] == "submitted" and after["replayed"] is True
    assert after["job_ids"] == submission(stack, keys[3])["job_ids"]


def test_queue_false_asks_for_the_refusal_and_a_new_submission_queues_behind_a_waiting_one(
        stack: InProcessStack) -> None:
    first = stack.submit(event(0))
    with drain_running(stack), redis.Redis.from_url(stack.redis_url) as client:
        second = stack.submit(event(1))
        assert (first["status"], second["status"]) == ("submitted", "queued")
        # No slot free, whatever the time since the first took one (a slot is under half a real second):
        # the budget paused, as after Sume refused a create with 429, then let go.
        creates = Budget(client, CREATE_BUDGET, 10, 300, stack.clock.now, reserve_every=NO_DAY_RESERVE)
        creates.pause_key(3_600)
        with pytest.raises(Exception, match="create budget is exhausted: retry the same event in"):
            stack.submit({**event(2), "queue": False})
        creates.pause_key(0)
    assert stack.metric_totals()["CreateBudgetExhausted"] == 1
    assert stack.sim.stats()["create_requests"] == 1

    # Once the budget has a slot again (the drain's message not delivered yet: nothing reserved it),
    # a new submission still queues behind the one waiting: arrival order, not the first to ask.
    with redis.Redis.from_url(stack.redis_url) as client:
        budget = Budget(client, CREATE_BUDGET, 10, 300, stack.clock.now, reserve_every=NO_DAY_RESERVE)
        # the budget refills with time: wait the time its next slot is away (a clock, not another actor)
        wait_until(lambda: budget.take(mode="peek").wait <= 0, 10, lambda: "the create budget has no slot",
                   lambda left: time.sleep(min(left, stack.clock.to_real(budget.take(mode="peek").wait))))
    behind = stack.submit(event(3))
    assert behind["status"] == "queued" and behind["estimated_create_at"] >= second["estimated_create_at"]
    assert stack.sim.stats()["create_requests"] == 1
    keys = [second["idempotency_key"], behind["idempotency_key"]]
    stack.drive(lambda: settled(stack, keys), timeout=30, fanout_every=1.0)
    order = [submission(stack, k)["job_ids"][0] for k in keys]
    assert [j for j in stack.sim.stats()["jobs"] if j in order] == order
