"""The poll message schema (messages.py): v2 round trips, v1 messages in flight during a deploy
still parse, and poison is refused with a clear reason."""

from __future__ import annotations

import json

import pytest

from sume_poller.core.messages import (
    RESULT_PHASE,
    VERSION,
    Finding,
    MessageError,
    PollMessage,
    Source,
    parse_message,
)

TOKEN = "0123456789abcdef0123456789abcdef"


def test_a_v2_message_round_trips_with_every_field() -> None:
    msg = PollMessage(job_id="job_1", kind="video", deadline_at=1_900_000_000, due_at=1_800_000_123.5, token=TOKEN,
                      seq=4, submitted_at=1_800_000_000, profile="video|d16", reads=3, result_reads=1, errors=2,
                      seen_running_at=1_800_000_100.0, phase=RESULT_PHASE,
                      outcome=Finding("completed", Source.STATUS, "succeeded", result_ready=False),
                      seen_terminal_at=1_800_000_120.0, result_waits=2, slot_at=1_800_000_123.5,
                      found_by="sweep", normal_due=1_800_000_200.0, paced_at=1_800_000_130.0,
                      refused_since=1_800_000_110.0)
    assert parse_message(msg.to_json()) == msg
    assert json.loads(msg.to_json())["v"] == VERSION


def test_messages_of_the_previous_version_still_parse() -> None:
    """Messages already queued when the new code deploys: a v1 step of a chain, and a v1 fan-out
    message without a token (its claim starts a chain)."""
    v1 = {"v": 1, "job_id": "job_1", "kind": "image", "deadline_at": 1_900_000_000, "due_at": 0, "token": TOKEN,
          "seq": 3, "attempt": 5, "errors": 1}
    msg = parse_message(json.dumps(v1))
    assert (msg.token, msg.seq, msg.reads, msg.errors, msg.phase) == (TOKEN, 3, 5, 1, "status")
    tokenless = parse_message(json.dumps({**v1, "token": None, "seq": 0}))
    assert tokenless.token is None


@pytest.mark.parametrize(("body", "reason"), [
    ("{", "not JSON"),
    ("[]", "not a JSON object"),
    (json.dumps({"v": 4}), "unsupported message version"),
    (json.dumps({"v": 2, "job_id": "job_1", "kind": "image", "deadline_at": 1, "due_at": 0, "token": TOKEN,
                 "surprise": 1}), "unknown fields"),
    (json.dumps({"v": 2, "job_id": "../etc", "kind": "image", "deadline_at": 1, "due_at": 0, "token": TOKEN}),
     "job id"),
    (json.dumps({"v": 2, "job_id": "job_1", "kind": "image", "deadline_at": 1, "due_at": 0}), "without a token"),
    (json.dumps({"v": 2, "job_id": "job_1", "kind": "image", "deadline_at": 1, "due_at": 0, "token": TOKEN,
                 "phase": "result"}), "needs an outcome"),
    (json.dumps({"v": 1, "job_id": "job_1", "kind": "image", "deadline_at": 1, "due_at": 0, "reads": 1}),
     "unknown fields"),
    ("x" * 5000, "larger than"),
    (json.dumps({"v": 2, "job_id": "job_1", "kind": "image", "deadline_at": 1, "due_at": 0, "token": TOKEN,
                 "phase": "result", "outcome": {"status": "failed", "source": "rumour"}}), "outcome.source"),
    (json.dumps({"v": 2, "job_id": "job_1", "kind": "image", "deadline_at": 1, "due_at": 0, "token": TOKEN,
                 "phase": "result", "outcome": {"status": "completed", "result_ready": "no"}}), "result_ready"),
    (json.dumps({"v": 2, "job_id": "job_1", "kind": "image", "deadline_at": 1, "due_at": 0, "token": TOKEN,
                 "phase": "result", "outcome": {"status": "completed", "payload": {}}}), "unknown outcome fields"),
])
def test_poison_is_refused_with_a_clear_reason(body: str, reason: str) -> None:
    with pytest.raises(MessageError, match=reason):
        parse_message(body)


def test_an_outcome_from_before_sources_were_recorded_is_never_taken_as_confirmed() -> None:
    """Messages queued by the previous release: a failure in the result phase came from a list (a
    status read now confirms it); a completed one was the job's own status."""
    base = {"v": 2, "job_id": "job_1", "kind": "image", "deadline_at": 1, "due_at": 0, "token": TOKEN,
            "phase": "result"}
    failed = parse_message(json.dumps({**base, "outcome": {"status": "failed", "sume_status": "failed"}}))
    completed = parse_message(json.dumps({**base, "outcome": {"status": "completed"}}))
    assert failed.outcome is not None and failed.outcome.to_json() == {
        "status": "failed", "sume_status": "failed", "source": "list"}
    assert completed.outcome is not None and completed.outcome.to_json() == {"status": "completed", "source": "status"}


def test_a_v2_message_in_flight_during_a_deploy_parses_into_the_typed_finding_and_is_written_back_as_v2() -> None:
    """The outcome is one typed value (who said what); its JSON is the v2 object, so a v2 body
    round-trips byte for byte and only a message carrying a v3 field is written as v3."""
    body = json.dumps({"deadline_at": 1_900_000_000, "due_at": 5.0, "errors": 0, "job_id": "job_1", "kind": "image",
                       "outcome": {"error": {"code": "x"}, "source": "webhook", "status": "failed",
                                   "sume_status": "failed"},
                       "phase": "result", "reads": 0, "result_reads": 0, "result_waits": 0, "seq": 1,
                       "token": TOKEN, "v": 2}, separators=(",", ":"), sort_keys=True)
    msg = parse_message(body)
    assert msg.outcome == Finding("failed", Source.WEBHOOK, "failed", {"code": "x"})
    assert msg.outcome.next_read() is None and not msg.outcome.confirmed and msg.to_json() == body
    assert json.loads(msg.next(refused_since=7.0).to_json())["v"] == VERSION == 3
    with pytest.raises(MessageError, match="unknown fields"):  # a v2 body never carries a v3 field
        parse_message(json.dumps({**json.loads(body), "refused_since": 7.0}))


@pytest.mark.parametrize(("finding", "needs"), [
    (Finding("failed", Source.WEBHOOK), None),
    (Finding("canceled", Source.LIST), "status"),
    (Finding("failed", Source.STATUS), "status"),
    (Finding("completed", Source.LIST), "result"),
    (Finding("completed", Source.WEBHOOK), "result"),
    (Finding("completed", Source.STATUS), "result"),
    (Finding("completed", Source.STATUS, result_ready=False), "status"),
])
def test_the_one_rule_of_what_a_finding_still_needs(finding: Finding, needs: str | None) -> None:
    assert finding.next_read() == needs
    assert finding.confirmed == (finding.source is Source.STATUS)
