"""Every outcome path names its evidence and records only what Sume said (poller.py): a refused result
read never becomes an outcome by itself, a key check without an answer proves nothing, only 401/403/404
end a job read, the deadline reads once more, an unknown status is not terminal. Through the poller's
real state machine over the unit tier's fakes."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import done, refused, retry, status
from test_poller import Rig

from sume_poller.core.jobs import Evidence
from sume_poller.core.messages import RESULT_PHASE, STATUS_PHASE, Finding, PollMessage, Source, parse_message
from sume_poller.limits.budget import Grant
from sume_poller.poll.step import LAST_READ_WAIT, Outcome
from sume_poller.sume.client import Refused, Retryable
from sume_poller.sume.listing import Listing
from sume_poller.sume.status import Oversized, Result, interpret_status

#: Refusals of a read that the contract does not name for it (a proxy's, a gateway's, Sume's own).
OTHER_4XX = [400, 402, 410, 413, 422, 431]


@pytest.fixture
def rig() -> Rig:
    return Rig()


def handed(rig: Rig, source: Source, job_id: str = "job_a") -> PollMessage:
    """A finishing step a sweep (list) or a webhook handed the job to: it reads the result."""
    msg = rig.submit(job_id)
    rig.lease.values[job_id] = f"{msg.token}:1*"
    return msg.next(seq=1, phase=RESULT_PHASE, found_by="sweep" if source is Source.LIST else "webhook",
                    seen_terminal_at=rig.clock.now(), outcome=Finding("completed", source, "completed"))


def other(http_status: int) -> Refused:
    return Refused("credits" if http_status == 402 else "request", http_status, code=f"code_{http_status}")


def record(rig: Rig, job_id: str = "job_a") -> dict[str, Any]:
    return rig.store.records[job_id]


# == the result route's refusals ==================================================================
@pytest.mark.parametrize("http_status", [400, 402, 410, 422])
@pytest.mark.parametrize("source", [Source.LIST, Source.WEBHOOK])
def test_a_refused_result_read_after_only_a_list_or_webhook_said_finished_reads_the_jobs_status_first(
        rig: Rig, http_status: int, source: Source) -> None:
    """Before: recorded completed without its result (``http_<status>``) on a list's or a webhook's word."""
    rig.sume.result["job_a"] = [other(http_status)]
    out = rig.run(handed(rig, source))
    nxt = rig.next_of(out)
    assert out.name == "unconfirmed" and record(rig)["status"] == "pending" and rig.bus.events == []
    assert (nxt.phase, nxt.outcome, nxt.due_at) == (STATUS_PHASE, None, rig.clock.now())
    rig.sume.status["job_a"] = [status("running")]
    assert rig.run(nxt).name == "requeued" and record(rig)["status"] == "pending"  # the list/webhook was wrong


def follow(rig: Rig, msg: PollMessage, steps: int = 200) -> list[Outcome]:
    return rig.follow(msg, steps=steps)


@pytest.mark.parametrize("http_status", [400, 403, 410, 422])
def test_a_result_refused_after_the_status_said_completed_is_retried_over_the_window_then_recorded_saying_so(
        rig: Rig, http_status: int) -> None:
    """Before: 400/410/422 recorded completed without the result at once; a 403 went to the key check
    and recorded ``failed`` a job Sume's status route called completed."""
    rig.sume.status["job_a"] = [done()]
    rig.sume.result["job_a"] = [refused("forbidden", 403) if http_status == 403 else other(http_status)]
    msg = rig.submit()
    started = rig.clock.now()
    outcomes = follow(rig, msg)
    window = rig.poller.s.jobs.refusal_window
    assert [o.name for o in outcomes[1:-1]] == ["refused"] * (len(outcomes) - 2)
    assert all("SumeReadRefused" in o.signals for o in outcomes[:-1])
    rec = record(rig)
    assert (rec["status"], rec["error"]["code"], rec["evidence"]) == ("completed", "result_refused", "status_read")
    assert f"HTTP {http_status}" in rec["error"]["message"] and "result_json" not in rec
    assert rig.clock.now() >= started + window and rig.sume.reads("status") == 1  # the status is not read again
    assert 5 <= rig.sume.reads("result") <= 25  # the error backoff over the window: bounded
    assert [j for j, _ in rig.bus.events] == ["job_a"]


def test_a_result_that_comes_inside_the_window_is_recorded_with_it_and_ends_the_refusals(rig: Rig) -> None:
    rig.sume.status["job_a"] = [done()]
    rig.sume.result["job_a"] = [other(410), other(410), Result({"url": "u"})]
    outcomes = follow(rig, rig.submit())
    assert [o.name for o in outcomes] == ["refused", "refused", "terminal"]
    rec = record(rig)
    assert (rec["status"], rec["evidence"], rec["result_json"]) == ("completed", "result_read", '{"url":"u"}')


def test_a_refusal_window_starts_over_after_an_answer(rig: Rig) -> None:
    rig.sume.status["job_a"] = [other(400), status("running"), other(400)]
    msg = rig.submit()
    first = rig.next_of(rig.run(msg))
    assert first.refused_since == rig.clock.now() and parse_message(first.to_json()).v == 3
    rig.clock.t = first.due_at
    answered = rig.next_of(rig.run(first))
    assert answered.refused_since is None and answered.errors == 0
    rig.clock.t = answered.due_at
    again = rig.next_of(rig.run(answered))
    assert again.refused_since == rig.clock.now()


# == the key check =================================================================================
@pytest.mark.parametrize("no_answer", [retry(503), retry(429, retry_after=5.0),
                                       Retryable("transport:ReadTimeoutError")])
def test_a_key_check_without_an_answer_is_no_evidence_asks_again_later_and_is_not_kept(
        rig: Rig, no_answer: Retryable) -> None:
    """Before: a list read that answered 5xx/429/nothing counted as "the key is fine": the job was
    recorded failed, and so was every 403 in the container for the next minute (cached)."""
    rig.sume.status["job_f"] = [refused("forbidden", 403)]
    rig.sume.status["job_g"] = [refused("forbidden", 403)]
    rig.sume.listing = [no_answer, no_answer, Listing(({"id": "job_x"},), None, False)]
    first = rig.run(rig.submit("job_f"))
    assert first.name == "transient" and record(rig, "job_f")["status"] == "pending"
    other_job = rig.run(rig.submit("job_g"))  # nothing was kept: this 403 asks the list again
    assert other_job.name == "transient" and rig.sume.reads("list") == 2
    rig.clock.advance(60)
    out = rig.run(rig.next_of(first))
    assert out.status == "failed" and rig.sume.reads("list") == 3  # an answer: only this job is refused
    rec = record(rig, "job_f")
    assert (rec["error"]["code"], rec["evidence"]) == ("forbidden", "status_read")


# == the job route's refusals ========================================================================
@pytest.mark.parametrize("http_status", OTHER_4XX)
def test_only_401_403_404_end_a_job_any_other_4xx_is_retried_and_recorded_only_over_the_window(
        rig: Rig, http_status: int) -> None:
    """Before: one 400/410/413/422/431 from GET /jobs/{id} (a proxy's or gateway's answer would do)
    failed a running job at first sight."""
    rig.sume.status["job_a"] = [other(http_status)]
    msg = rig.submit()
    first = rig.run(msg)
    assert first.name == "refused" and "SumeReadRefused" in first.signals and record(rig)["status"] == "pending"
    nxt = rig.next_of(first)
    assert nxt.due_at > rig.clock.now() and nxt.errors == 1  # the error backoff
    rig.clock.t = nxt.due_at
    outcomes = [first, *follow(rig, nxt)]
    rec = record(rig)
    assert (rec["status"], rec["evidence"], rec["error"]["code"]) == ("failed", "status_read", f"code_{http_status}")
    assert rig.clock.now() - msg.due_at >= rig.poller.s.jobs.refusal_window
    assert all("SumeReadRefused" in o.signals for o in outcomes) and len(outcomes) <= 25  # bounded by the backoff


@pytest.mark.parametrize(("reply", "code"), [(refused("forbidden", 403), "forbidden"), (refused("not_found", 404),
                                                                                         "not_found")])
def test_a_403_or_a_404_past_its_grace_still_ends_the_job_at_once(rig: Rig, reply: Refused, code: str) -> None:
    rig.sume.status["job_a"] = [reply]
    rig.sume.listing = [Listing(({"id": "job_x"},), None, False)]
    msg = rig.submit()
    rig.clock.advance(rig.poller.s.jobs.not_found_grace + 1)
    out = rig.run(msg.next(due_at=rig.clock.now()))
    assert out.status == "failed" and (record(rig)["error"]["code"], record(rig)["evidence"]) == (code, "status_read")


# == the deadline ====================================================================================
def at_deadline(rig: Rig, msg: PollMessage) -> PollMessage:
    rig.clock.t = msg.deadline_at
    return msg.next(due_at=rig.clock.t)


def test_at_the_deadline_a_running_job_is_read_once_more_and_recorded_with_what_the_read_found(rig: Rig) -> None:
    rig.sume.status["job_a"] = [status("running"), status("processing")]
    msg = rig.submit()
    nxt = rig.next_of(rig.run(msg))
    out = rig.run(at_deadline(rig, nxt))
    rec = record(rig)
    assert out.status == "timed_out" and out.status_reads == 1  # before: no read at the deadline
    assert (rec["error"]["code"], rec["sume_status"], rec["evidence"]) == (
        "deadline_exceeded", "processing", "deadline")


def test_a_result_that_became_ready_during_the_final_wait_is_fetched_at_the_deadline(rig: Rig) -> None:
    """Sume's gate said result_ready false; it opened during the last wait: before, timed_out unread."""
    rig.sume.status["job_a"] = [done(ready=False), done(ready=True)]
    waiting = rig.next_of(rig.run(rig.submit()))
    assert waiting.phase == RESULT_PHASE
    out = rig.run(at_deadline(rig, waiting))
    rec = record(rig)
    assert out.status == "completed" and (rec["result_json"], rec["evidence"]) == ('{"url":"u"}', "result_read")


def test_a_result_ready_at_the_deadline_is_read_once_from_the_result_route(rig: Rig) -> None:
    rig.sume.status["job_a"] = [done(gated=False)]
    rig.sume.result["job_a"] = [refused("not_found", 404), Result({"url": "late"})]
    waiting = rig.next_of(rig.run(rig.submit()))
    out = rig.run(at_deadline(rig, waiting))
    assert out.status == "completed" and out.result_reads == 1 and out.status_reads == 0
    assert record(rig)["result_json"] == '{"url":"late"}'
    rig.sume.status["job_b"] = [done(gated=False)]
    rig.sume.result["job_b"] = [refused("not_found", 404)]
    late = rig.next_of(rig.run(rig.submit("job_b")))
    assert rig.run(at_deadline(rig, late)).status == "timed_out"  # still not there: result_not_ready
    assert (record(rig, "job_b")["error"]["code"], record(rig, "job_b")["evidence"]) == ("result_not_ready", "deadline")


def test_the_last_read_waits_for_a_slot_only_so_long_past_the_deadline(rig: Rig) -> None:
    rig.sume.status["job_a"] = [status("running")]
    msg = rig.submit()
    rig.budget.grants = [Grant(False, LAST_READ_WAIT + 60)]  # the budget refuses a slot that far
    out = rig.run(at_deadline(rig, msg))
    assert out.status == "timed_out" and rig.sume.calls == [] and "no read slot" in record(rig)["error"]["message"]
    assert rig.budget.patience[-1] == LAST_READ_WAIT  # the farthest slot it asked for
    rig.sume.status["job_b"] = [done("failed", error={"code": "x"})]
    near = rig.submit("job_b")
    rig.budget.grants = [Grant(True, 30.0)]
    waiting = rig.run(at_deadline(rig, near))
    nxt = rig.next_of(waiting)
    assert waiting.name == "budget_wait" and nxt.slot_at == rig.clock.now() + 30.0  # past the deadline: its slot
    rig.clock.t = nxt.slot_at
    assert rig.run(nxt).status == "failed" and record(rig, "job_b")["evidence"] == "status_read"


# == an unknown status ===============================================================================
def test_an_unknown_status_with_terminal_true_is_read_on_and_reported_loudly(rig: Rig) -> None:
    rig.sume.status["job_a"] = [interpret_status({"job": {"status": "finalizing", "terminal": True,
                                                         "result_ready": True}}), done()]
    out = rig.run(rig.submit())
    assert out.name == "requeued" and "UnknownStatus" in out.signals and record(rig)["status"] == "pending"
    rig.follow(rig.next_of(out))
    assert record(rig)["status"] == "completed" and record(rig)["evidence"] == "result_read"


# == every path names its evidence ====================================================================
def test_every_terminal_path_names_its_evidence(rig: Rig) -> None:
    paths: dict[str, tuple[Any, ...]] = {
        "job_done": (done(), None, "completed", Evidence.RESULT),
        "job_big": (done(), Oversized(80_000_000), "completed", Evidence.RESULT),
        "job_fail": (done("expired"), None, "expired", Evidence.STATUS),
        "job_403": (refused("forbidden", 403), None, "failed", Evidence.STATUS),
    }
    rig.sume.listing = [Listing((), None, False)]
    for job_id, (reply, result, _, _) in paths.items():
        rig.sume.status[job_id] = [reply]
        if result is not None:
            rig.sume.result[job_id] = [result]
        rig.follow(rig.submit(job_id))
    webhook = handed(rig, Source.WEBHOOK, "job_hook").next(outcome=Finding("failed", Source.WEBHOOK, "failed"))
    rig.run(webhook)
    rig.sume.status["job_late"] = [status("running", hint=10**9)]  # next read at the deadline: the last
    rig.follow(rig.submit("job_late"))
    recorded = {j: (r["status"], r["evidence"]) for j, r in rig.store.records.items()}
    assert recorded == {**{j: (s, str(e)) for j, (_, _, s, e) in paths.items()},
                        "job_hook": ("failed", "webhook"), "job_late": ("timed_out", "deadline")}
    assert {r["evidence"] for r in rig.store.records.values()} <= set(Evidence)


def test_a_refusal_of_the_status_route_after_it_said_completed_does_not_make_the_job_failed(rig: Rig) -> None:
    """The wait on Sume's gate reads the status route; a 403 there (the key check clearing the key) or
    refusals over the window no longer record failed a job that route called completed."""
    rig.sume.status["job_a"] = [done(ready=False), refused("forbidden", 403)]
    rig.sume.listing = [Listing((), None, False)]
    waiting = rig.next_of(rig.run(rig.submit()))
    rig.clock.t = waiting.due_at
    out = rig.run(waiting)
    rec = record(rig)
    assert out.status == "completed" and (rec["error"]["code"], rec["evidence"]) == ("forbidden", "status_read")
    assert "result_json" not in rec and rec["sume_status"] == "completed"


def test_the_deadline_of_a_job_waiting_on_sumes_gate_says_its_result_was_not_ready(rig: Rig) -> None:
    rig.sume.status["job_a"] = [done(ready=False), retry(503)]
    waiting = rig.next_of(rig.run(rig.submit()))
    out = rig.run(at_deadline(rig, waiting))  # the last read gets no answer
    rec = record(rig)
    assert out.status == "timed_out" and (rec["error"]["code"], rec["evidence"]) == ("result_not_ready", "deadline")


# == a removed key =================================================================================
def test_a_job_of_a_removed_key_is_recorded_key_removed_through_the_real_stand_in(rig: Rig) -> None:
    """The poll function's stand-in for a key the configuration no longer holds (wiring.poll.RemovedKey)
    takes the calls the poller makes. Before: its signatures had drifted from the client's (``budget=``
    where the poller passes ``timeout=``), every read raised TypeError, the message went back to SQS
    until the DLQ and the job stayed pending; the JobReader protocol makes mypy catch that now."""
    from sume_poller.wiring.poll import RemovedKey

    rig.poller.sume = RemovedKey("acme", 1_000_000)
    out = rig.run(rig.submit())
    assert out.send is None
    assert (record(rig)["status"], record(rig)["evidence"], record(rig)["error"]["code"]) == (
        "failed", Evidence.KEY_REMOVED.value, "key_removed")
