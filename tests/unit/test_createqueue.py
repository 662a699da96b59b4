"""Submissions that queue, through fakes: the create queue's names, drain message and estimate
(createqueue.py), submit's queue decisions (submit.py) and the drain's steps (drain.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest
from fakes import FakeBudget, FakeClock, FakeLease, FakePacer, FakeQueue, FakeStore, FakeSume, retry

from sume_poller.config.keys import Limits, SumeKey
from sume_poller.creates.createqueue import EXPIRED, DrainMessage, DrainMessageError, drain_lease, estimate_create_at
from sume_poller.creates.drain import REPLAY_WINDOW, Drainer, DrainReport
from sume_poller.creates.submit import (
    CreateBudgetExhausted,
    SubmitKey,
    SubmitRetryable,
    SubmitSettings,
    Submitter,
    one_key,
)
from sume_poller.limits.budget import Grant, granted_per_window
from sume_poller.limits.lease import BUSY_RETRY, ChainStep
from sume_poller.store.submissions import CREATED, QUEUED, REJECTED, queue_item_id, submission_id
from sume_poller.sume.client import Refused
from sume_poller.sume.created import Created

ENV = {"JOBS_TABLE": "jobs", "POLL_QUEUE_URL": "q", "SUME_BASE_URL": "https://sume.test/api/v1",
       "SUME_API_KEY_NAME": "/k", "REDIS_URL": "rediss://cache.example:6379", "CREATE_QUEUE_URL": "cq",
       "SUBMIT_QUEUE_DEADLINE_SECONDS": "600"}
TOKEN = "ab" * 16


# -- createqueue.py --------------------------------------------------------------------------------------


def test_a_drain_message_round_trips_and_names_only_a_key_other_than_the_default() -> None:
    default = DrainMessage(TOKEN, 3)
    assert json.loads(default.to_json()) == {"drain": True, "token": TOKEN, "seq": 3, "errors": 0, "v": 1}
    assert DrainMessage.parse(default.to_json()) == default
    named = DrainMessage(TOKEN, 4, "acme", errors=2, slot=1_800_000_007.5)
    assert DrainMessage.parse(named.to_json()) == named


@pytest.mark.parametrize("body", [
    "not json", "[]", json.dumps({"token": TOKEN, "v": 1}),  # not a drain message
    json.dumps({"drain": True, "token": TOKEN, "v": 2}),  # another version
    json.dumps({"drain": True, "token": TOKEN, "v": 1, "job_id": "x"}),  # a field it does not know
    json.dumps({"drain": True, "token": "short", "v": 1}),
    json.dumps({"drain": True, "token": TOKEN, "key": "no spaces", "v": 1}),
    json.dumps({"drain": True, "token": TOKEN, "seq": -1, "v": 1}),
    json.dumps({"drain": True, "token": TOKEN, "seq": True, "v": 1}),
    json.dumps({"drain": True, "token": TOKEN, "errors": 1.5, "v": 1}),
    json.dumps({"drain": True, "token": TOKEN, "slot": -3, "v": 1}),
    json.dumps({"drain": True, "token": TOKEN, "slot": "soon", "v": 1}),
])
def test_a_malformed_drain_message_is_poison(body: str) -> None:
    with pytest.raises(DrainMessageError):
        DrainMessage.parse(body)


def test_queue_items_sort_in_arrival_order_and_two_in_one_millisecond_differ() -> None:
    ids = [queue_item_id("acme", t, f"order-{n:04d}") for n, t in enumerate((9.5, 10.0, 10.0, 100.25, 1e9))]
    assert ids[1] != ids[2] and ids[0] < ids[1] and ids[2] < ids[3] < ids[4]
    assert ids[0].startswith("#q:acme:000000000009500:")
    # A float clock time a hair below a millisecond is that millisecond: sequential arrivals keep their order.
    assert queue_item_id("k", 1805760060.037, "x").split(":")[2] == "001805760060037"
    assert queue_item_id("k", 1805760060.0369999, "x").split(":")[2] == "001805760060037"
    assert submission_id("acme", "order-0001") == "#sub:acme:order-0001" and drain_lease("acme") == "!drain:acme"


def test_the_estimate_paces_the_minute_and_spills_into_the_next_day_window() -> None:
    now = 86_400.0 * 20_000 + 3_600  # an hour into a UTC day
    # 10 a minute grants 9.64 (granted_per_window: the limit over 62.25 s): one create every 6.225 s
    # after the next free slot.
    step = 60 / granted_per_window(10)
    assert step == pytest.approx(6.225)
    assert estimate_create_at(now, 0, 2.0, 10, 300, {}) == now + 2.0
    assert estimate_create_at(now, 4, 2.0, 10, 300, {}) == now + 2.0 + 4 * step
    # 3 a day, 1 used: the first two ahead take this window's last two; the third waits for the next.
    reset = 86_400.0 * 20_001
    state = {"day_used": 1.0, "day_reset": reset * 1000}
    assert estimate_create_at(now, 1, 0.0, 10, 3, state) == now + step
    assert estimate_create_at(now, 2, 0.0, 10, 3, state) == reset
    assert estimate_create_at(now, 3, 0.0, 10, 3, state) == reset + step
    assert estimate_create_at(now, 5, 0.0, 10, 3, state) == reset + 86_400  # the day after
    assert estimate_create_at(now, 5, 0.0, 0, 0, {}) == now  # not limited here


# -- submit.py: the queue decisions --------------------------------------------------------------------


class Parts:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.sume, self.store, self.queue, self.creates_queue = FakeSume(), FakeStore(), FakeQueue(), FakeQueue()
        self.lease, self.creates = FakeLease(), FakeBudget()
        self.creates.per_minute, self.creates.per_day = 10, 300  # type: ignore[attr-defined]
        settings = SubmitSettings.from_env(ENV)
        self.settings = replace(settings, common=replace(settings.common, clock=self.clock))
        self.keys = one_key(self.sume, self.creates, FakePacer())  # type: ignore[arg-type]
        self.submitter = Submitter(self.settings, keys=self.keys, store=self.store,  # type: ignore[arg-type]
                                   queue=self.queue, lease=self.lease, create_queue=self.creates_queue,  # type: ignore[arg-type]
                                   sleep=lambda s: None)

    def submit(self, event: dict[str, Any]) -> dict[str, Any]:
        return self.submitter.handle(event, lambda: 25_000)

    def creates_sent(self) -> int:
        return sum(1 for kind, _ in self.sume.calls if kind == "create")

    def queued(self) -> list[str]:
        return self.store.queue_head("default", 100)

    def drainer(self) -> Drainer:
        return Drainer(self.settings, self.submitter, self.keys, self.store, self.creates_queue,  # type: ignore[arg-type]
                       self.lease, "default")  # type: ignore[arg-type]


@pytest.fixture
def parts() -> Parts:
    return Parts()


def image(idempotency_key: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "image", "params": {"prompt": idempotency_key}, "idempotency_key": idempotency_key, **extra}


def test_over_the_budget_a_submission_is_queued_with_an_estimate_and_its_drain_started(parts: Parts) -> None:
    parts.creates.grants = [Grant(False, 30.0), Grant(False, 30.0)]  # the take, then the estimate's peek
    reply = parts.submit(image("order-0001"))
    assert reply["status"] == "queued" and reply["replayed"] is False and reply["job_ids"] == []
    assert reply["estimated_create_at"] == 1_800_000_030 and reply["deadline_at"] == 1_800_000_600
    assert parts.creates_sent() == 0
    (item,) = parts.queued()
    record = parts.store.submission("default", "order-0001")
    assert record is not None and (record["status"], record["queue_item"]) == (QUEUED, item)
    (first,) = parts.creates_queue.sent
    message = DrainMessage.parse(first.body)
    assert message.key is None and message.seq == 0 and first.delay == 0.0  # the default key: no key named
    assert parts.lease.values[drain_lease("default")] == f"{message.token}:0"


def test_the_estimate_does_not_move_back_by_the_time_the_queue_query_takes(parts: Parts,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget's peek answers a wait from the moment it runs: the estimate adds it to the time read
    just before it, not before the queue's query (a slow query, on a loaded CI machine, moved an
    estimate back by what the query took)."""
    slot = parts.clock.now() + 30.0
    monkeypatch.setattr(parts.creates, "take", lambda **_: Grant(False, slot - parts.clock.now()))
    ahead = parts.store.queue_ahead

    def slow_query(key_id: str, item_id: str) -> int:
        parts.clock.advance(4.0)
        return ahead(key_id, item_id)

    monkeypatch.setattr(parts.store, "queue_ahead", slow_query)
    reply = parts.submit(image("order-0009"))
    assert reply["status"] == "queued" and reply["estimated_create_at"] == math.ceil(slot)


def test_while_a_drain_runs_a_new_submission_queues_behind_even_with_a_free_slot(parts: Parts) -> None:
    parts.lease.values[drain_lease("default")] = f"{TOKEN}:4"
    reply = parts.submit(image("order-0002"))
    assert reply["status"] == "queued" and parts.creates_sent() == 0 and parts.creates.modes == ["peek"]
    assert parts.creates_queue.sent == []  # the running drain takes it: no second drain


def test_behind_a_waiting_submission_queues_even_with_the_drain_lease_free(parts: Parts) -> None:
    parts.creates.grants = [Grant(False, 7.5)]
    assert parts.submit(image("order-0003"))["status"] == "queued"
    parts.lease.values.clear()  # the drain's lease is gone (expired); its item still waits
    parts.lease.down = True  # and Redis cannot say: the queue's index decides
    reply = parts.submit(image("order-0004"))
    assert reply["status"] == "queued" and parts.creates_sent() == 0
    assert len(parts.queued()) == 2


def test_queue_false_keeps_the_refusal_and_a_bad_queue_value_is_rejected(parts: Parts) -> None:
    parts.creates.grants = [Grant(False, 12.0)]
    with pytest.raises(CreateBudgetExhausted, match="in 12 s"):
        parts.submit(image("order-0005", queue=False))
    assert parts.queued() == [] and parts.creates_queue.sent == []
    assert parts.submit(image("order-0006", queue="yes"))["status"] == "rejected"


def test_a_replay_is_answered_from_the_table_without_the_create_budget(parts: Parts) -> None:
    parts.sume.creates = [Created(("job_1",), "req_1")]
    created = parts.submit(image("order-0007"))
    assert created["status"] == "submitted" and parts.store.submission("default", "order-0007")["status"] == CREATED  # type: ignore[index]
    parts.creates.grants = [Grant(False, 20.0), Grant(False, 20.0)]
    assert parts.submit(image("order-0008"))["status"] == "queued"
    takes = parts.creates.takes

    again, queued_again = parts.submit(image("order-0007")), parts.submit(image("order-0008"))
    assert (again["status"], again["job_ids"], again["replayed"]) == ("submitted", ["job_1"], True)
    assert (queued_again["status"], queued_again["replayed"]) == ("queued", True)
    assert parts.creates.modes[takes:] == ["peek"]  # the queued one's fresh estimate: nothing taken
    assert parts.creates_sent() == 1 and len(parts.queued()) == 1 and len(parts.creates_queue.sent) == 1


def test_a_402_is_recorded_final_and_a_replay_answers_it(parts: Parts) -> None:
    parts.sume.creates = [Refused("credits", 402, "insufficient_credits", request_id="req_9")]
    assert parts.submit(image("order-0009"))["status"] == "rejected"
    record = parts.store.submission("default", "order-0009")
    assert record is not None and record["status"] == REJECTED and record["http_status"] == 402
    again = parts.submit(image("order-0009"))
    assert (again["status"], again["error"], again["http_status"], again["replayed"]) == (
        "rejected", "insufficient_credits", 402, True)
    assert parts.creates_sent() == 1
    parts.sume.creates = [Refused("key", 401, "unauthorized")]  # the key's refusal is not the submission's
    assert parts.submit(image("order-0010"))["status"] == "rejected"
    attempt = parts.store.submission("default", "order-0010")  # only its attempt record: no outcome, nothing unknown
    assert attempt is not None and "status" not in attempt and attempt["unknown_creates"] == 0


def test_a_direct_create_of_unknown_outcome_queued_after_it_keeps_the_evidence(parts: Parts) -> None:
    # The create timed out (Sume may have created it), then the budget had no slot for the retry: the
    # submission queues, and its record counts the create whose outcome is unknown.
    parts.sume.creates = [retry(504)]
    parts.creates.grants = [Grant(True, 0.0), Grant(False, 30.0), Grant(False, 30.0)]
    assert parts.submit(image("order-0011"))["status"] == "queued" and parts.creates_sent() == 1
    record = parts.store.submission("default", "order-0011")
    assert record is not None and (record["status"], record["unknown_creates"]) == (QUEUED, 1)


def test_a_direct_create_is_noted_on_a_duplicate_queued_meanwhile(parts: Parts) -> None:
    parts.creates.grants = [Grant(False, 30.0), Grant(False, 30.0)]
    assert parts.submit(image("order-0012"))["status"] == "queued"  # a duplicate, queued first
    seen: list[Any] = []

    def noted(kind: str, params: Any, idempotency_key: str, timeout: float | None = None) -> Any:
        seen.append(dict(parts.store.submission("default", idempotency_key) or {}))
        raise RuntimeError("the invocation died after Sume took the create")

    parts.sume.create = noted  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):  # this one raced past the replay check and creates
        parts.submitter._create(parts.keys(None), "image", {"prompt": "order-0012"}, "order-0012", lambda: 25_000)
    assert [(r["status"], r["unknown_creates"]) for r in seen] == [(QUEUED, 1)]


def test_a_direct_create_leaves_an_attempt_record_and_its_retry_creates_again(parts: Parts) -> None:
    parts.sume.creates = [retry(504)] * 3
    with pytest.raises(SubmitRetryable):
        parts.submit(image("order-0013"))
    attempt = parts.store.submission("default", "order-0013")
    assert attempt is not None and "status" not in attempt and attempt["unknown_creates"] == 3
    parts.sume.creates = [Created(("job_13",), "req_13", replayed=True)]
    reply = parts.submit(image("order-0013"))  # the event again: an attempt record is no answer
    assert (reply["status"], reply["job_ids"]) == ("submitted", ["job_13"]) and parts.creates_sent() == 4
    assert parts.store.submission("default", "order-0013")["status"] == CREATED  # type: ignore[index]


# -- drain.py: one step ----------------------------------------------------------------------------------


def queue_two(parts: Parts) -> DrainMessage:
    """Two submissions queued (the budget full), the drain started: its first message."""
    parts.creates.grants = [Grant(False, 30.0)] * 4
    for key in ("order-0100", "order-0101"):
        assert parts.submit(image(key))["status"] == "queued"
    parts.creates.grants = []
    return DrainMessage.parse(parts.creates_queue.sent[0].body)


def step(parts: Parts, message: DrainMessage) -> tuple[DrainReport, DrainMessage | None]:
    sent = len(parts.creates_queue.sent)
    report = DrainReport()
    parts.drainer().step(message, report, lambda: 25_000)
    after = parts.creates_queue.sent[sent:]
    return report, DrainMessage.parse(after[0].body) if after else None


def test_a_step_creates_the_head_records_its_job_and_moves_on(parts: Parts) -> None:
    message = queue_two(parts)
    parts.sume.creates = [Created(("job_7",), "req_7")]
    report, nxt = step(parts, message)
    assert report.created == 1 and [k for kind, k in parts.sume.calls if kind == "create"] == ["order-0100"]
    record = parts.store.submission("default", "order-0100")
    assert record is not None and (record["status"], record["job_ids"]) == (CREATED, ["job_7"])
    assert parts.store.records["job_7"]["status"] == "pending" and len(parts.queue.sent) == 1  # its chain
    assert len(parts.queued()) == 1 and nxt is not None and (nxt.token, nxt.seq) == (message.token, 1)
    assert parts.lease.values[drain_lease("default")] == f"{message.token}:1"


def test_a_slot_further_away_is_reserved_and_waited_for_without_taking_another(parts: Parts) -> None:
    message = queue_two(parts)
    parts.creates.grants = [Grant(True, 20.0)]
    _, nxt = step(parts, message)
    assert nxt is not None and nxt.slot == pytest.approx(parts.clock.now() + 20.0)
    assert parts.creates_queue.sent[-1].delay == pytest.approx(20.0) and parts.creates_sent() == 0
    parts.clock.advance(5)  # delivered early (an SQS hop): it waits for its slot, takes nothing
    takes = parts.creates.takes
    _, again = step(parts, nxt)
    assert parts.creates.takes == takes and again is not None and again.slot == nxt.slot
    parts.clock.advance(15)
    parts.sume.creates = [Created(("job_8",))]
    step(parts, again)
    assert parts.creates.modes[-1] == "confirm" and parts.creates_sent() == 1


def test_a_429_retries_the_same_head_and_a_402_is_final(parts: Parts) -> None:
    message = queue_two(parts)
    parts.sume.creates = [retry(429, retry_after=40.0)]
    report, nxt = step(parts, message)
    assert report.retried == 1 and nxt is not None and nxt.errors == 1
    assert parts.creates_queue.sent[-1].delay == pytest.approx(40.0)
    assert parts.creates.feedback_seen[-1].retry_after == 40.0  # every create of the key waits
    parts.sume.creates = [Refused("credits", 402, "insufficient_credits")]
    report, nxt = step(parts, nxt)
    assert report.rejected == 1 and nxt is not None and nxt.errors == 0
    assert [k for kind, k in parts.sume.calls if kind == "create"] == ["order-0100", "order-0100"]  # same key
    record = parts.store.submission("default", "order-0100")
    assert record is not None and record["status"] == REJECTED and record["error"]["code"] == "insufficient_credits"


def test_a_head_past_its_deadline_is_rejected_and_never_created(parts: Parts) -> None:
    message = queue_two(parts)
    parts.clock.advance(601)
    takes = parts.creates.takes
    report, nxt = step(parts, message)
    assert report.expired == 1 and parts.creates_sent() == 0 and parts.creates.takes == takes
    record = parts.store.submission("default", "order-0100")
    assert record is not None and record["status"] == REJECTED and record["error"]["code"] == EXPIRED
    assert nxt is not None and len(parts.queued()) == 1 and "unknown_attempts" not in record
    # Create attempts Sume answered without creating anything (429s) leave nothing unknown: the next
    # head expires as the first did, never created later; the slot its step had reserved and not
    # spent is carried to the next head.
    parts.store.note_create("default", "order-0101", parts.queued()[0], now=parts.clock.now())
    parts.store.create_answered("default", "order-0101")
    report, last = step(parts, replace(nxt, errors=2, slot=parts.clock.now() + 30))
    record = parts.store.submission("default", "order-0101")
    assert report.expired == 1 and record is not None and record["status"] == REJECTED
    assert "unknown_attempts" not in record and parts.creates_sent() == 0 and parts.creates.takes == takes
    assert last is not None and last.slot == pytest.approx(parts.clock.now() + 30) and last.errors == 0


def test_a_head_settled_by_a_step_that_died_before_its_dequeue_is_counted_once_by_the_next(
        parts: Parts, monkeypatch: pytest.MonkeyPatch) -> None:
    message = queue_two(parts)
    parts.clock.advance(601)
    store_dequeue = parts.store.dequeue

    def timed_out(item_id: str) -> bool:  # the Lambda's time ran out (or DynamoDB's reply was lost)
        raise TimeoutError("the step died after settling the head")

    monkeypatch.setattr(parts.store, "dequeue", timed_out)
    report = DrainReport()
    with pytest.raises(TimeoutError):
        parts.drainer().step(message, report, lambda: 25_000)
    assert report.expired == 0 and len(parts.queued()) == 2  # settled, still queued, not counted yet
    assert parts.store.submission("default", "order-0100")["status"] == REJECTED  # type: ignore[index]
    monkeypatch.setattr(parts.store, "dequeue", store_dequeue)
    parts.lease.values.clear()  # its claim expired
    again, nxt = step(parts, message)  # SQS delivers it again: the head is settled, its item left
    assert (again.expired, again.rejected, again.created) == (1, 0, 0) and len(parts.queued()) == 1
    assert nxt is not None and parts.store.submission("default", "order-0101")["status"] == QUEUED  # type: ignore[index]


def test_a_settle_whose_reply_was_lost_counts_what_its_write_recorded(parts: Parts,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    message = queue_two(parts)
    parts.clock.advance(601)
    settle = parts.store.settle_submission

    def reply_lost(key_id: str, idempotency_key: str, queue_item: str, values: dict[str, Any]) -> bool:
        assert settle(key_id, idempotency_key, queue_item, values)  # the first attempt landed...
        return settle(key_id, idempotency_key, queue_item, values)  # ...its retry found it settled

    monkeypatch.setattr(parts.store, "settle_submission", reply_lost)
    report, _ = step(parts, message)
    assert (report.expired, report.rejected) == (1, 0) and len(parts.queued()) == 1


def test_a_head_a_direct_duplicate_settles_while_the_step_settles_it_is_not_counted(
        parts: Parts, monkeypatch: pytest.MonkeyPatch) -> None:
    message = queue_two(parts)
    parts.clock.advance(601)
    settle = parts.store.settle_submission

    def duplicate_first(key_id: str, idempotency_key: str, queue_item: str, values: dict[str, Any]) -> bool:
        record = parts.store.submission(key_id, idempotency_key)
        assert record is not None
        parts.store.records[record["job_id"]] = {"job_id": record["job_id"], "status": CREATED, "job_ids": ["job_1"]}
        return settle(key_id, idempotency_key, queue_item, values)

    monkeypatch.setattr(parts.store, "settle_submission", duplicate_first)
    report, _ = step(parts, message)
    assert (report.created, report.rejected, report.expired) == (0, 0, 0) and len(parts.queued()) == 1


def test_a_head_settled_by_a_direct_duplicate_leaves_the_queue_uncounted(parts: Parts) -> None:
    message = queue_two(parts)
    record = parts.store.submission("default", "order-0100")
    assert record is not None
    parts.store.put_submission({"job_id": record["job_id"], "status": CREATED, "job_ids": ["job_1"]})
    report, nxt = step(parts, message)
    assert (report.created, report.rejected, report.expired) == (0, 0, 0)
    assert len(parts.queued()) == 1 and nxt is not None


def unknown_create_then_deadline(parts: Parts) -> DrainMessage:
    """The head's create got no answer (a 503: Sume may have created it), then its deadline came."""
    message = queue_two(parts)
    parts.sume.creates = [retry(503)]
    report, nxt = step(parts, message)
    assert report.retried == 1 and nxt is not None and nxt.errors == 1
    assert parts.store.submission("default", "order-0100")["unknown_creates"] == 1  # type: ignore[index]
    parts.clock.advance(601)
    return nxt


@pytest.mark.parametrize(("answer", "status"), [
    (Created(("job_9",), "req_9", replayed=True), CREATED),  # an attempt had landed: Sume returns its job
    (Created(("job_9",), "req_9"), CREATED),  # none had: created now, as the caller asked
    (Refused("credits", 402, "insufficient_credits"), REJECTED),  # refused: Sume's answer recorded
])
def test_a_head_at_its_deadline_after_a_create_of_unknown_outcome_is_replayed_and_ends_known(
        parts: Parts, answer: object, status: str) -> None:
    nxt = unknown_create_then_deadline(parts)
    parts.sume.creates = [answer]
    report, after = step(parts, replace(nxt, errors=0))  # the message's count is not the evidence: the record is
    assert [k for kind, k in parts.sume.calls if kind == "create"] == ["order-0100"] * 2  # its own Idempotency-Key
    assert parts.creates.modes[-1] == "ahead" and parts.creates.patience[-1] == 0.0  # a slot ahead of the queue
    assert report.replayed == 1 and report.expired == 0
    record = parts.store.submission("default", "order-0100")
    assert record is not None and record["status"] == status and len(parts.queued()) == 1 and after is not None
    if status == CREATED:
        assert record["job_ids"] == ["job_9"] and parts.store.records["job_9"]["status"] == "pending"  # watched
    else:
        assert record["error"]["code"] == "insufficient_credits" and "unknown_attempts" not in record


def test_a_replay_without_a_slot_or_an_answer_comes_again_until_its_window_ends(parts: Parts) -> None:
    nxt = unknown_create_then_deadline(parts)
    parts.creates.grants = [Grant(False, 45.0)]  # no create slot now, even ahead of the queue
    report, again = step(parts, nxt)
    assert report.expired == 0 and parts.creates_sent() == 1 and again is not None  # not rejected: it waits
    assert parts.creates_queue.sent[-1].delay == pytest.approx(45.0)
    parts.clock.advance(45)
    parts.sume.creates = [retry(429, retry_after=20.0), retry(504)]  # Sume's window; then no answer again
    report, again = step(parts, again)
    assert report.replayed == 1 and report.expired == 0 and again is not None
    assert parts.creates_queue.sent[-1].delay == pytest.approx(20.0)
    assert parts.store.submission("default", "order-0100")["unknown_creates"] == 1  # type: ignore[index]  # the 429 is known
    parts.clock.advance(20)
    report, again = step(parts, again)
    assert report.replayed == 1 and again is not None
    assert parts.store.submission("default", "order-0100")["unknown_creates"] == 2  # type: ignore[index]
    parts.clock.advance(REPLAY_WINDOW)  # no answer within the replay window: rejected, and it says why
    report, _ = step(parts, again)
    record = parts.store.submission("default", "order-0100")
    assert report.expired == 1 and report.expired_unknown == 1 and parts.creates_sent() == 3
    assert record is not None and record["error"]["code"] == EXPIRED and record["unknown_attempts"] == 2


def test_a_drain_create_is_noted_before_it_is_sent_so_a_crash_after_it_leaves_the_evidence(parts: Parts) -> None:
    message = queue_two(parts)
    seen: list[Any] = []

    def crash(kind: str, params: Any, idempotency_key: str, timeout: float | None = None) -> Any:
        seen.append(parts.store.submission("default", idempotency_key)["unknown_creates"])  # type: ignore[index]
        raise RuntimeError("the invocation died after Sume took the create")

    parts.sume.create = crash  # type: ignore[method-assign]
    report = parts.drainer().run({"Records": [{"messageId": "m1", "body": message.to_json()}]}, lambda: 25_000)
    assert report.failures == ["m1"] and seen == [1]
    del parts.sume.create  # the redelivery (the same message: errors 0) comes at the deadline
    parts.lease.values.clear()
    parts.clock.advance(601)
    parts.sume.creates = [Created(("job_5",), "req_5", replayed=True)]
    report, _ = step(parts, message)
    record = parts.store.submission("default", "order-0100")
    assert report.replayed == 1 and record is not None and (record["status"], record["job_ids"]) == (CREATED, ["job_5"])


def test_a_create_is_not_sent_for_a_head_settled_meanwhile(parts: Parts) -> None:
    message = queue_two(parts)
    item = parts.queued()[0]
    parts.store.settle_submission("default", "order-0100", item, {"status": CREATED, "job_ids": ["job_1"]})
    drainer = parts.drainer()
    report = DrainReport()
    head = parts.store.get(item)  # read before a duplicate settled it
    assert head is not None
    drainer._create(parts.keys(None), message, ChainStep(message.token, 0, "n"), head, report, lambda: 25_000)
    assert parts.creates_sent() == 0 and item not in parts.queued()


def test_a_duplicate_delivery_is_dropped_and_an_empty_queue_ends_the_drain(parts: Parts) -> None:
    message = queue_two(parts)
    parts.lease.values[drain_lease("default")] = f"{message.token}:0!other"  # another delivery holds it
    report, nxt = step(parts, message)
    assert report.dropped == 1 and nxt is None and parts.creates_sent() == 0
    for item in parts.queued():
        parts.store.dequeue(item)
    parts.lease.values[drain_lease("default")] = f"{message.token}:0"
    _, nxt = step(parts, message)
    assert nxt is None and drain_lease("default") not in parts.lease.values


def test_a_later_drain_step_comes_back_while_a_delivery_of_an_older_step_holds_its_claim(parts: Parts) -> None:
    """The drain's lease follows lease.py: step 1 never creates beside a delivery of step 0 that
    holds its claim (an SQS duplicate, say); it is sent again, due in BUSY_RETRY real seconds."""
    message = queue_two(parts)
    parts.lease.values[drain_lease("default")] = f"{message.token}:0!other"
    later = replace(message, seq=1)
    report, again = step(parts, later)
    assert report.dropped == 0 and parts.creates_sent() == 0 and again == later
    assert parts.creates_queue.sent[-1].delay == parts.clock.from_real(BUSY_RETRY)
    assert parts.lease.values[drain_lease("default")] == f"{message.token}:0!other"


def test_a_named_key_has_its_own_queue_drain_and_messages_naming_it(parts: Parts) -> None:
    acme = SubmitKey(SumeKey("acme", Limits(), lambda: "sume_test_acme"), parts.sume, parts.creates,  # type: ignore[arg-type]
                     FakePacer())  # type: ignore[arg-type]
    default = parts.keys(None)

    def keys(wanted: str | None) -> SubmitKey:
        return acme if wanted == "acme" else default

    parts.keys = keys
    parts.submitter.keys = keys
    parts.creates.grants = [Grant(False, 30.0)] * 2
    reply = parts.submit(image("order-0200", key="acme"))
    assert (reply["status"], reply["key"]) == ("queued", "acme")
    assert parts.store.queue_head("acme") and not parts.queued()  # its own partition, q:acme
    message = DrainMessage.parse(parts.creates_queue.sent[0].body)
    assert message.key == "acme" and parts.lease.values[drain_lease("acme")] == f"{message.token}:0"
    parts.sume.creates = [Created(("job_default",)), Created(("job_acme",))]
    assert parts.submit(image("order-0201"))["status"] == "submitted"  # the default key's queue is empty
    step(parts, message)
    record = parts.store.submission("acme", "order-0200")
    assert record is not None and record["status"] == CREATED
    assert parts.store.records["job_acme"]["key"] == "acme"
