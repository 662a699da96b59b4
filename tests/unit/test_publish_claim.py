"""One actor at a time publishes a job's terminal event (outbox.py): the publish claim on the job
record, taken by the terminal write itself and by a conditional write for anyone else; fan-out's
outbox message, a loser of the terminal write and a redelivery leave a held claim alone. Each test
plays one of the interleavings that published twice without any crash, through the poller's real
state machine over the unit tier's fakes (the store's conditions as store.py writes them)."""

from __future__ import annotations

import pytest
from fakes import done
from test_poller import Rig

from sume_poller.core.aws import reset_session
from sume_poller.core.messages import OUTBOX_PHASE, PollMessage
from sume_poller.limits.lease import new_token
from sume_poller.poll.outbox import CLAIM_SKEW_REAL, PUBLISH_CLAIM_MIN_REAL
from sume_poller.store.events import CALL_MAX_REAL, EventBus, PublishUnknown


@pytest.fixture
def rig() -> Rig:
    return Rig()


def outbox_message(msg: PollMessage) -> PollMessage:
    """What fan-out sends for an unfinished outbox (no lease, no read)."""
    return msg.next(token=new_token(), seq=0, phase=OUTBOX_PHASE)


def test_fan_outs_outbox_message_beside_a_chain_still_publishing_leaves_the_outbox_to_it(rig: Rig) -> None:
    """A chain wins the terminal write and is still inside its outbox when fan-out's next tick finds
    the record in an outbox partition and sends its message at once: that message must not publish
    (before: it did, beside the chain - two raw events, no crash)."""
    rig.sume.status["job_a"] = [done("failed")]
    msg = rig.submit()
    beside: list[str] = []
    rig.poller.step_hook = lambda name, job_id: beside.append(rig.run(outbox_message(msg)).name) if (
        name == "written" and not beside) else None
    out = rig.run(msg)
    assert out.status == "failed" and beside == ["outbox_held"]
    assert [j for j, _ in rig.bus.events] == ["job_a"] and rig.bus.calls == 1
    assert "event_pending" not in rig.store.records["job_a"] and "event_claim" not in rig.store.records["job_a"]


def test_a_loser_of_the_terminal_write_leaves_the_outbox_to_the_winner_publishing_it(rig: Rig) -> None:
    """A duplicate of a step (Redis down: fenced; or a redelivery) loses the terminal write and gets the
    winner's record with its outbox open while the winner publishes: it must not publish too."""
    rig.sume.status["job_a"] = [done("canceled")]
    msg = rig.submit()
    rig.lease.values.clear()  # the duplicate finds the lease free: a fresh chain of its own
    losers: list[str] = []

    def during_the_winners_call(job_id: str) -> None:  # the winner is inside PutEvents
        rig.lease.values.clear()
        losers.append(rig.run(msg).name)

    rig.bus.during = during_the_winners_call
    out = rig.run(msg)
    assert out.status == "canceled" and losers == ["outbox_held"]
    assert [j for j, _ in rig.bus.events] == ["job_a"]


def test_a_putevents_taken_but_never_answered_is_published_again_only_after_the_claim_expires(rig: Rig) -> None:
    """No SDK retry under the claim: the claim's expiry is the retry. Until it expires nobody else
    publishes; the next holder then counts EventOutcomeUnknown (its event may be on the bus twice:
    the only raw duplicate left)."""
    rig.sume.status["job_a"] = [done("failed")]
    msg = rig.submit()
    rig.bus.lose_next = 1
    with pytest.raises(PublishUnknown):
        rig.run(msg)
    assert rig.bus.calls == 1 and rig.store.records["job_a"]["event_pending"]  # one call, no SDK retry
    assert rig.run(outbox_message(msg)).name == "outbox_held"  # fan-out's message, the claim still held
    rig.lease.values.clear()
    assert rig.run(msg).name == "outbox_held"  # SQS's redelivery of the step
    assert rig.bus.calls == 1
    rig.clock.advance(rig.poller.finisher.claim_ttl_real + 0.001)
    again = rig.run(outbox_message(msg))
    assert again.name == "outbox" and again.signals == ("EventOutcomeUnknown",) and rig.bus.calls == 2
    assert "event_pending" not in rig.store.records["job_a"]


def test_a_refused_putevents_frees_the_claim_at_once_and_is_not_counted_unknown(rig: Rig) -> None:
    rig.sume.status["job_a"] = [done("failed")]
    msg = rig.submit()
    rig.bus.fail_next = 1
    with pytest.raises(RuntimeError):
        rig.run(msg)
    assert "event_claim" not in rig.store.records["job_a"]  # EventBridge said no: the event is not on the bus
    out = rig.run(outbox_message(msg))
    assert out.name == "outbox" and out.signals == () and len(rig.bus.events) == 1


def test_a_holder_whose_claim_has_less_than_one_call_left_does_not_publish(rig: Rig) -> None:
    """The call could outlast the claim (another holder could publish beside it): the holder frees the
    claim instead, and the next holder publishes."""
    rig.sume.status["job_a"] = [done("failed")]
    msg = rig.submit()
    ttl = rig.poller.finisher.claim_ttl_real

    def slow_outbox(name: str, job_id: str) -> None:
        if name == "written":
            rig.clock.advance(ttl - CLAIM_SKEW_REAL)  # the outbox's writes before the call took most of it

    rig.poller.step_hook = slow_outbox
    assert rig.run(msg).status == "failed" and rig.bus.calls == 0
    rig.poller.step_hook = None
    assert rig.run(outbox_message(msg)).name == "outbox" and rig.bus.calls == 1


def test_the_claim_outlasts_an_invocation_and_the_sdk_sends_putevents_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim lasts the lease's claim TTL (ClaimTtlSeconds, above the poll function's timeout); the
    events client makes one attempt (botocore's standard mode made three: max_attempts counts retries)."""
    assert Rig().poller.finisher.claim_ttl_real == max(60, PUBLISH_CLAIM_MIN_REAL) == 60
    for name, value in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "unit", "AWS_SECRET_ACCESS_KEY": "unit"
                        }.items():
        monkeypatch.setenv(name, value)
    reset_session()
    try:
        config = EventBus("default").events.meta.config  # built, not called: no network
        assert config.retries == {"mode": "standard", "total_max_attempts": 1}
        assert config.connect_timeout + config.read_timeout == CALL_MAX_REAL == 4
    finally:
        reset_session()
