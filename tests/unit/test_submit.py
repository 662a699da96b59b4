"""Submit (submit.py) through fakes: the money path - idempotency, the create budget, Retry-After,
replays, and the chain submit starts."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fakes import FakeBudget, FakeClock, FakeLease, FakePacer, FakeQueue, FakeStore, FakeSume, retry

from sume_poller.core.messages import parse_message
from sume_poller.creates.submit import (
    CreateBudgetExhausted,
    SubmitRetryable,
    SubmitSettings,
    Submitter,
    derive_idempotency_key,
    one_key,
)
from sume_poller.limits.budget import Grant
from sume_poller.sume.client import Refused
from sume_poller.sume.created import Created

ENV = {"JOBS_TABLE": "jobs", "POLL_QUEUE_URL": "q", "SUME_BASE_URL": "https://sume.test/api/v1",
       "SUME_API_KEY_NAME": "/k", "REDIS_URL": "rediss://cache.example:6379"}


class Parts:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.sume, self.store, self.queue = FakeSume(), FakeStore(), FakeQueue()
        self.lease, self.creates = FakeLease(), FakeBudget()
        self.slept: list[float] = []
        settings = SubmitSettings.from_env(ENV)
        settings = replace(settings, common=replace(settings.common, clock=self.clock))
        self.submitter = Submitter(settings, keys=one_key(self.sume, self.creates, FakePacer()),  # type: ignore[arg-type]
                                   store=self.store, queue=self.queue, lease=self.lease,  # type: ignore[arg-type]
                                   sleep=self.slept.append)

    def submit(self, event: dict[str, object], ms_left: int = 25_000) -> dict[str, object]:
        return self.submitter.handle(event, lambda: ms_left)


@pytest.fixture
def parts() -> Parts:
    return Parts()


def test_a_submission_records_the_job_takes_its_lease_and_queues_its_first_poll(parts: Parts) -> None:
    parts.sume.creates = [Created(("job_1",), "req_1")]
    reply = parts.submit({"kind": "image", "params": {"prompt": "p"}, "idempotency_key": "order-0042"})
    assert reply["status"] == "submitted" and reply["new"] == ["job_1"] and reply["replayed"] is False
    first = parse_message(parts.queue.sent[0].body)
    assert parts.lease.values["job_1"] == f"{first.token}:0"  # fan-out sees the chain and leaves it
    assert parts.store.records["job_1"]["chain_due_at"] == pytest.approx(first.due_at)


def test_two_identical_submissions_without_a_key_are_one_job_and_the_reply_says_so(parts: Parts) -> None:
    event = {"kind": "image", "params": {"prompt": "same"}}
    parts.sume.creates = [Created(("job_1",)), Created(("job_1",), replayed=True)]
    first, second = parts.submit(event), parts.submit(event)
    assert first["replayed"] is False and second["replayed"] is True and second["derived_key"] is True
    assert first["idempotency_key"] == second["idempotency_key"] == derive_idempotency_key("image", {"prompt": "same"})
    assert len(parts.queue.sent) == 1  # no second chain


def test_retry_after_is_honoured_within_the_invocation(parts: Parts) -> None:
    parts.sume.creates = [retry(503, retry_after=12.0), Created(("job_1",))]
    assert parts.submit({"kind": "video", "params": {}})["status"] == "submitted"
    assert parts.slept == [12.0]
    keys = [k for kind, k in parts.sume.calls if kind == "create"]
    assert len(keys) == 2 and keys[0] == keys[1]  # the retry replays the same key


def test_retry_after_beyond_the_invocation_is_a_clear_retryable_error(parts: Parts) -> None:
    parts.sume.creates = [retry(429, retry_after=120.0)]
    with pytest.raises(SubmitRetryable, match="after 120 s"):
        parts.submit({"kind": "video", "params": {}})
    assert parts.slept == []


def test_over_the_create_budget_the_event_fails_saying_when_to_retry(parts: Parts) -> None:
    parts.creates.grants = [Grant(False, 37.2)]
    with pytest.raises(CreateBudgetExhausted, match="in 38 s") as caught:
        parts.submit({"kind": "image", "params": {}})
    assert caught.value.retry_after == pytest.approx(37.2)
    assert parts.sume.calls == []  # nothing was sent to Sume, nothing can bill later


def test_a_402_is_final_and_bad_events_are_rejected(parts: Parts) -> None:
    parts.sume.creates = [Refused("credits", 402, "insufficient_credits")]
    assert parts.submit({"kind": "image", "params": {}})["status"] == "rejected"
    assert len([c for c in parts.sume.calls if c[0] == "create"]) == 1
    for event in ({"kind": "nope"}, {"kind": "image", "params": []}, {"kind": "image", "idempotency_key": "x"},
                  {"kind": "image", "job_id": "../x"}, []):
        assert parts.submit(event)["status"] == "rejected", event  # type: ignore[arg-type]


def test_registering_a_known_job_starts_its_chain_once(parts: Parts) -> None:
    assert parts.submit({"kind": "video", "job_id": "job_7"})["new"] == ["job_7"]
    again = parts.submit({"kind": "video", "job_id": "job_7"})
    assert again["new"] == [] and again["replayed"] is True and len(parts.queue.sent) == 1


def test_redis_down_still_records_and_queues_the_first_poll(parts: Parts) -> None:
    parts.lease.down = True
    parts.sume.creates = [Created(("job_1",))]
    assert parts.submit({"kind": "image", "params": {}})["new"] == ["job_1"]
    assert len(parts.queue.sent) == 1
