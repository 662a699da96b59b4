"""One terminal event per job with no crash at all, on the real parts: the publish claim on the job
record (store.py's conditional writes on moto server over HTTP), EventBridge through moto (an EventBridge
rule feeding an SQS sink) and, for the whole system, the in-process stack (real handlers, redis-server,
moto, the Sume simulator). Three interleavings published twice before the claim:

* fan-out's outbox message beside a chain still inside its outbox (it sent one at once, no age check);
* a loser of the terminal write (a duplicate finding the lease free) beside the winner publishing;
* a PutEvents EventBridge took but answered late, re-sent by botocore's standard retry.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import boto3
import pytest
import redis
from invariants import Crash, check
from scenario import fault_suite_fixtures, submit

from sume_poller.core.aws import reset_session
from sume_poller.core.clock import Clock
from sume_poller.core.jobs import Evidence
from sume_poller.core.messages import PollMessage
from sume_poller.limits.lease import new_token
from sume_poller.poll.holds import NoHold
from sume_poller.poll.outbox import Finisher
from sume_poller.store.events import EventBus, PublishUnknown
from sume_poller.store.records import Ending, JobStore, PublishClaim
from tools.slowreply import SlowReplies
from tools.stack.base import EventSink
from tools.stack.inprocess import InProcessStack
from tools.template import Provisioned

pytestmark = pytest.mark.integration
NOW = Clock().now()

module_stack, stack = fault_suite_fixtures()


# == the claim on the record (moto) ===================================================================
@pytest.fixture
def store(template_resources: Provisioned) -> JobStore:
    return JobStore("jobs", 4)


def test_the_publish_claim_is_taken_by_the_terminal_write_and_then_only_once_it_expired_or_was_freed(
        store: JobStore) -> None:
    store.put_pending("job_c", "image", now=NOW, deadline_at=int(NOW) + 600, chain_due_at=NOW + 5)
    won = store.record_terminal("job_c", Ending("failed", evidence=Evidence.STATUS), now=NOW,
                                claim=PublishClaim("a" * 32, NOW + 60))
    assert won.won and won.record is not None and (won.record["event_claim"], won.record["chain_due_at"]) == (
        "a" * 32, NOW + 60) and won.record["evidence"] == "status_read"
    held = store.claim_outbox("job_c", PublishClaim("b" * 32, NOW + 90), now=NOW + 30)
    assert not held.won and held.record is not None and held.record["event_claim"] == "a" * 32  # the holder's
    expired = store.claim_outbox("job_c", PublishClaim("b" * 32, NOW + 120), now=NOW + 60)
    assert expired.won and expired.took_over and expired.record is not None
    assert expired.record["event_claim"] == "b" * 32 and store.get("job_c")["chain_due_at"] == NOW + 120  # type: ignore[index]
    assert not store.release_claim("job_c", "a" * 32)  # the first holder's claim is gone
    assert store.release_claim("job_c", "b" * 32)
    freed = store.claim_outbox("job_c", PublishClaim("c" * 32, NOW + 150), now=NOW + 61)
    assert freed.won and not freed.took_over  # a freed claim: no publish was in doubt
    assert store.clear_outbox("job_c", now=NOW + 62)
    record = store.get("job_c")
    assert record is not None and "event_claim" not in record and "event_pending" not in record
    done = store.claim_outbox("job_c", PublishClaim("d" * 32, NOW + 200), now=NOW + 500)
    assert not done.won and done.record is not None and "event_pending" not in done.record  # nothing to publish
    assert store.claim_outbox("job_none", PublishClaim("e" * 32, NOW), now=NOW).record is None


# == PutEvents taken, answered late (moto behind a forwarder) =============================================
@pytest.fixture
def bus_behind_a_slow_reply(aws: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SlowReplies, EventSink]]:
    """EventBridge (moto) whose PutEvents replies arrive after the events client's read timeout (3 s)."""
    sink = EventSink(boto3.client("sqs"), boto3.client("events"))
    with SlowReplies(aws, match=lambda headers: "PutEvents" in headers.get("X-Amz-Target", ""), delay=3.5) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_EVENTBRIDGE", proxy.url)
        reset_session()
        yield proxy, sink
    reset_session()


def test_a_putevents_taken_but_answered_late_is_sent_once_and_its_claim_kept_until_it_expires(
        template_resources: Provisioned, bus_behind_a_slow_reply: tuple[SlowReplies, EventSink]) -> None:
    """Before: botocore's standard retry re-sent it (three attempts: ``max_attempts`` 2 counts retries), each
    taken by EventBridge - raw duplicates with no crash. Now one attempt: the outcome is unknown, the claim
    stands, and only its expiry lets the next holder publish again, counted as ``EventOutcomeUnknown``."""
    proxy, sink = bus_behind_a_slow_reply
    clock, store = Clock(), JobStore("jobs", 4)
    finisher = Finisher(store, EventBus("default"), clock, lambda: None, claim_ttl_real=10.0)
    store.put_pending("job_slow", "image", now=clock.now(), deadline_at=int(clock.now()) + 600)
    claim = PublishClaim("f" * 32, clock.now() + 10.0)
    won = store.record_terminal("job_slow", Ending("canceled", evidence=Evidence.STATUS), now=clock.now(), claim=claim)
    assert won.won and won.record is not None
    with pytest.raises(PublishUnknown):
        finisher.finish_outbox("job_slow", won.record, claim)
    assert proxy.forwarded() == 1  # one request reached EventBridge: no SDK retry
    assert [e["job_id"] for e in sink.drain(wait_seconds=1)] == ["job_slow"]  # and EventBridge took it
    record = store.get("job_slow")
    assert record is not None and record["event_pending"] and record["event_claim"] == "f" * 32  # kept
    held = finisher.settle_outbox("job_slow", NoHold())
    assert held.name == "outbox_held" and proxy.forwarded() == 1


# == the whole system (in-process stack) ================================================================
def test_fan_outs_outbox_message_and_a_duplicate_beside_a_finishing_chain_publish_nothing(
        stack: InProcessStack) -> None:
    """A job's chain is held just after its terminal write (inside its outbox): meanwhile fan-out
    ticks - the record is in an outbox partition, unfinished - and what it sends is delivered, with a
    copy of the chain's step whose lease is gone (as after Redis lost it). Then the chain goes on.
    Before: fan-out's outbox message and the copy each published beside the chain (raw duplicates, no crash)."""
    written, go_on = threading.Event(), threading.Event()
    holding: list[str] = []

    def hold_after_the_write(name: str, job_id: str) -> None:
        if name == "written" and not holding:
            holding.append(job_id)
            written.set()
            assert go_on.wait(60), "the test never let the chain go on"

    stack.step_hook = hold_after_the_write
    ids = submit(stack, 1, {"duration": 100, "steps": 1, "outcome": "failed"})
    chain = threading.Thread(target=lambda: stack.drive(lambda: go_on.is_set(), 60))
    chain.start()
    try:
        assert written.wait(60), "no chain reached its terminal write"
        stack.step_hook = None
        job_id = holding[0]
        record = stack.record(job_id)
        assert record is not None and record["event_pending"]
        beside = stack.fanout()
        stack.send(PollMessage(job_id=job_id, kind="image", deadline_at=int(record["deadline_at"]),
                               due_at=round(stack.clock.now(), 3), token=new_token()).to_json())
        with redis.Redis.from_url(stack.redis_url) as rdb:
            rdb.delete(f"sume:poll:{job_id}")  # the copy finds the lease free: a fresh chain
        delivered = stack.deliver(stack.receive(10))
    finally:
        go_on.set()
        chain.join(60)
    stack.drive(lambda: stack.settled(ids), 60)
    assert beside.get("outbox_claimed") == 1 and beside["outbox_sent"] == 0  # left to the chain publishing it
    assert delivered.report is not None and [o.name for o in delivered.report.outcomes] == ["outbox_held"]
    raw = Counter(e["job_id"] for e in stack.events())
    assert raw == Counter({j: 1 for j in ids}), raw  # raw events, not only distinct ones
    check(stack, ids, scenario="fan-out's outbox message and a duplicate beside a chain publishing",
          expected="failed", notes="one raw event per job")


def test_the_claim_on_a_crashed_chains_outbox_expires_and_fan_out_finishes_it(stack: InProcessStack) -> None:
    """A chain dies right after its terminal write, holding the claim: its redelivery leaves the outbox
    alone while the claim holds, and fan-out finishes it once the claim expired, counting the possible
    raw duplicate (a holder that died might have published)."""
    crashed: list[str] = []

    def die(name: str, job_id: str) -> None:
        if name == "written" and not crashed:
            crashed.append(job_id)
            raise Crash(job_id)

    stack.step_hook = die
    ids = submit(stack, 1, {"duration": 100, "steps": 1})
    stack.drive(lambda: bool(crashed), 30)
    stack.step_hook = None
    record = stack.record(ids[0])
    assert record is not None and record["event_pending"] and record["chain_due_at"] > stack.clock.now()
    assert stack.fanout()["outbox_claimed"] == 1
    stack.drive(lambda: stack.settled(ids), 60, fanout_every=1.0)
    check(stack, ids, scenario="a chain dies holding the publish claim", expected="completed")
    assert stack.metric_totals()["EventOutcomeUnknown"] == 1
    assert stack.clock.now() >= record["chain_due_at"]  # finished only after the claim expired
