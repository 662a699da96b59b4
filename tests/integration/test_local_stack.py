"""The in-process local stack (tools.stack.inprocess): the template's handlers on moto server with
real Redis and the Sume simulator, driven through the interface the demo and the e2e tier share.

The clock runs 20x fast (TimeScale 0.05): simulated jobs of a few clock seconds finish within
SQS's one-second DelaySeconds granularity, and a job older than JobMaxAgeSeconds=100 clock
seconds times out after 5 real seconds.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
import redis
from invariants import dlq_bodies
from scenario import stack_fixtures

from tools.stack.base import wait_until
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

SCALE = 0.05
PARAMETERS = {"JobMaxAgeSeconds": 100, "CreatesPerMinute": 0, "CreatesPerDay": 0}
#: A crashed poller's lease frees after 2 real seconds (the template's minimum is 31).
ENV = {"CLAIM_TTL_SECONDS": "2", "SUME_CONNECT_TIMEOUT": "0.5", "SUME_READ_TIMEOUT": "1"}
OUTCOMES = ("completed", "failed", "canceled", "expired")


class Crash(BaseException):
    """What the crash hook raises: not an Exception, so nothing in the handler may swallow it."""


module_stack, stack = stack_fixtures(SCALE, PARAMETERS, ENV)


def submit(stack: InProcessStack, outcome: str = "completed", duration: float = 3.0, kind: str = "image") -> str:
    reply = stack.submit({"kind": kind, "params": {"prompt": f"{outcome} {duration} {uuid.uuid4().hex}",
                                                   "sim": {"outcome": outcome, "duration": duration}}})
    assert reply["status"] == "submitted", reply
    (job_id,) = reply["job_ids"]
    return str(job_id)


def events_by_job(stack: InProcessStack) -> Counter[str]:
    return Counter(e["job_id"] for e in stack.events())


def test_jobs_reach_each_terminal_status_with_one_event_each(stack: InProcessStack) -> None:
    jobs = {outcome: submit(stack, outcome) for outcome in OUTCOMES}
    jobs["timed_out"] = submit(stack, duration=100_000)

    stack.drive(lambda: stack.settled(jobs.values()), timeout=30)
    stack.drive(lambda: len(stack.events()) >= len(jobs), timeout=10)

    records = {r["job_id"]: r for r in stack.records(jobs.values())}
    assert {status: records[job]["status"] for status, job in jobs.items()} == {s: s for s in jobs}
    completed = records[jobs["completed"]]
    assert isinstance(completed["reads"], int) and isinstance(completed["terminal_at"], int)
    assert completed["result_json"] and "pending_shard" not in completed
    events = {e["job_id"]: e for e in stack.events()}
    assert events_by_job(stack) == Counter(jobs.values())
    for job_id, event in events.items():
        assert event["status"] == records[job_id]["status"]
        assert event["event_id"] == f"{job_id}:terminal"
    assert stack.outcomes["terminal"] == len(jobs)
    totals = stack.metric_totals()
    for status in jobs:
        assert totals[f"Terminal_{status}"] == 1, totals
    assert totals["Submit_submitted"] == len(jobs)
    assert stack.queue_depth() == 0 and stack.dlq_depth() == 0


def test_duplicate_delivery_finishes_each_job_once(stack: InProcessStack) -> None:
    jobs = [submit(stack, duration=d) for d in (1.0, 3.0, 6.0)]

    stack.drive(lambda: stack.settled(jobs), timeout=30, duplicate=True)
    stack.drive(lambda: len(stack.events()) >= len(jobs), timeout=10)

    assert events_by_job(stack) == Counter(jobs)
    assert stack.outcomes["contention"] > 0, stack.outcomes  # every copy found the lease taken
    assert stack.last_report is not None and stack.last_report.outcomes


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_a_crash_leaves_the_whole_batch_and_the_job_still_ends_once(stack: InProcessStack) -> None:
    job_id = submit(stack, duration=2.0)
    messages: list[dict[str, object]] = []

    def arrived() -> bool:  # a long poll of the queue (submit's first message may be delayed)
        messages.extend(stack.receive(wait_seconds=1))
        return bool(messages)

    wait_until(arrived, 10, lambda: "submit's first poll message never arrived", lambda left: None)

    def crash(step: str, job: str) -> None:
        if step == "claimed" and job == job_id:
            raise Crash(job)

    stack.step_hook = crash
    delivery = stack.deliver(messages)  # type: ignore[arg-type]
    assert isinstance(delivery.crash, Crash) and delivery.report is None
    assert delivery.failed == {m["MessageId"] for m in messages}
    assert stack.crashes == 1 and stack.queue_depth() == len(messages)  # nothing was deleted

    stack.step_hook = None
    stack.drive(lambda: stack.settled([job_id]), timeout=30, fanout_every=0.5)
    stack.drive(lambda: len(stack.events()) >= 1, timeout=10)
    assert events_by_job(stack) == Counter([job_id])
    assert stack.record(job_id)["status"] == "completed"  # type: ignore[index]


def test_poison_messages_go_to_the_dead_letter_queue(stack: InProcessStack) -> None:
    stack.send("not a poll message")

    stack.drive(lambda: stack.dlq_depth() == 1, timeout=20)

    assert dlq_bodies(stack) == ["not a poll message"]
    assert stack.dlq_depth() == 1  # peeking leaves it there
    assert stack.outcomes["malformed"] >= 1


def test_reset_gives_a_clean_state(stack: InProcessStack) -> None:
    job_id = submit(stack)
    stack.drive(lambda: stack.settled([job_id]), timeout=30)
    stack.send("poison", 0)
    assert stack.records() and stack.metric_totals()

    stack.reset()

    assert stack.records() == [] and stack.events() == []
    assert stack.queue_depth() == 0 and stack.dlq_depth() == 0
    assert stack.metric_totals() == Counter() and stack.outcomes == Counter()
    assert redis.Redis.from_url(stack.redis_url).dbsize() == 0
    assert stack.sim.stats()["jobs"] == {}
    again = submit(stack)
    stack.drive(lambda: stack.settled([again]), timeout=30)
    stack.drive(lambda: len(stack.events()) >= 1, timeout=10)
    assert events_by_job(stack) == Counter([again])
