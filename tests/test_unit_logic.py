"""Unit tests of the pure logic: statuses, delays, message schema, reply classification, config."""

from __future__ import annotations

import json
import random

import pytest

from sume_poller.config import ConfigError, load_settings, redact_url
from sume_poller.jobs import (
    InvalidJobId,
    State,
    all_shards,
    backoff_delay,
    canonical_terminal_status,
    classify_status,
    error_delay,
    hint_delay,
    hop_delay,
    shard_of,
    validate_job_id,
)
from sume_poller.messages import MessageError, PollMessage, parse_message
from sume_poller.sume import (
    Pending,
    Retryable,
    Terminal,
    extract_job_ids,
    interpret_status,
    parse_retry_after,
)

BASE_ENV = {
    "JOBS_TABLE": "jobs", "POLL_QUEUE_URL": "http://q", "SUME_BASE_URL": "https://sume.test/api/v1/",
    "SUME_API_KEY_NAME": "/sume/key", "REDIS_URL": "redis://127.0.0.1:6379/0",
}


@pytest.mark.parametrize("status,state", [
    ("queued", State.ACTIVE), ("RUNNING", State.ACTIVE), ("processing", State.ACTIVE), ("pending", State.ACTIVE),
    ("completed", State.SUCCEEDED), ("Complete", State.SUCCEEDED), ("succeeded", State.SUCCEEDED),
    ("success", State.SUCCEEDED), ("ready", State.SUCCEEDED),
    ("failed", State.FAILED), ("canceled", State.FAILED), ("cancelled", State.FAILED), ("expired", State.FAILED),
    ("error", State.FAILED), ("errored", State.FAILED),
    ("mystery", State.UNKNOWN), ("", State.UNKNOWN), (None, State.UNKNOWN), (3, State.UNKNOWN),
])
def test_classify_status(status: object, state: State) -> None:
    assert classify_status(status) is state


@pytest.mark.parametrize("raw,succeeded,expected", [
    ("completed", None, "completed"), ("ready", None, "completed"), ("cancelled", None, "canceled"),
    ("errored", None, "failed"), ("expired", None, "expired"), ("weird", True, "completed"), ("weird", False, "failed"),
])
def test_canonical_terminal_status(raw: str, succeeded: bool | None, expected: str) -> None:
    assert canonical_terminal_status(raw, succeeded) == expected


@pytest.mark.parametrize("job_id", ["job_123", "a", "J-x_9" * 20, "0" * 128])
def test_valid_job_ids(job_id: str) -> None:
    assert validate_job_id(job_id) == job_id


@pytest.mark.parametrize("job_id", [
    "", "../etc", "job 1", "job:1", "job/1", "jöb", "x" * 129, "-lead", "_lead", "a.b", "a\nb", None, 5, "{tag}",
])
def test_invalid_job_ids(job_id: object) -> None:
    with pytest.raises(InvalidJobId):
        validate_job_id(job_id)


def test_backoff_is_short_for_images_long_for_video_and_jittered() -> None:
    rng = random.Random(1)
    images = [backoff_delay("image", a, rng) for a in range(10)]
    videos = [backoff_delay("video", a, rng) for a in range(10)]
    assert all(1 <= d <= 36 for d in images)
    assert images[0] <= 3 and videos[0] >= 8
    assert max(videos) > max(images)
    assert len({backoff_delay("video", 3, random.Random(s)) for s in range(20)}) > 1  # jitter


def test_error_delay_prefers_retry_after_then_exponential_capped() -> None:
    assert error_delay(1, 7.2) == 8
    assert error_delay(1, 0) == 1
    rng = random.Random(0)
    growing = [error_delay(n, None, rng) for n in (1, 2, 3, 4)]
    assert growing[0] < growing[3]
    assert error_delay(30, None, rng) <= 300


def test_hint_and_hop_delays() -> None:
    assert hint_delay(0) == 1 and hint_delay(2.1) == 3 and hint_delay(5) == 5
    assert hop_delay(2000, 900) == 900 and hop_delay(200.2, 900) == 201 and hop_delay(-4, 900) == 0


def test_long_delay_splits_into_hops_within_sqs_limit() -> None:
    remaining, hops = 2000.0, []
    while remaining >= 1:
        hop = hop_delay(remaining, 900)
        hops.append(hop)
        remaining -= hop
    assert hops == [900, 900, 200]


def test_shards_are_stable_and_in_range() -> None:
    assert shard_of("job_1", 8) == shard_of("job_1", 8)
    pending = {shard_of(f"job_{i}", 8) for i in range(200)}
    outbox = {shard_of(f"job_{i}", 8, "o") for i in range(200)}
    assert pending | outbox == set(all_shards(8)) and len(pending) == len(outbox) == 8
    assert all_shards(2) == ["p00", "p01", "o00", "o01"]  # fan-out reads pending, then outbox
    assert shard_of("job_1", 8, "o")[1:] == shard_of("job_1", 8)[1:]


def _msg(**kw: object) -> str:
    data = {"v": 1, "job_id": "job_1", "kind": "image", "deadline_at": 2_000_000_000, "due_at": 1.5,
            "token": None, "seq": 0, "attempt": 0, "errors": 0}
    data.update(kw)
    return json.dumps(data)


def test_message_round_trip() -> None:
    m = PollMessage(job_id="job_1", kind="video", deadline_at=5, due_at=2.5, token="ab" * 16, seq=3, attempt=2)
    assert parse_message(m.to_json()) == m
    assert m.lease_value == "ab" * 16 + ":3"
    assert PollMessage(job_id="j", kind="image", deadline_at=1, due_at=0).lease_value is None


@pytest.mark.parametrize("body,reason", [
    (None, "not a string"), ("{", "not JSON"), ("[1]", "not a JSON object"), (_msg(v=2), "version"),
    (_msg(job_id="../x"), "job id"), (_msg(kind="audio"), "kind"), (_msg(token="XYZ"), "token"),
    (_msg(due_at="soon"), "due_at"), (_msg(due_at=float("nan")), "due_at"), (_msg(seq=-1), "seq"),
    (_msg(attempt=True), "attempt"), (_msg(seq=2), "seq without a token"), (_msg(extra=1), "unknown fields"),
    (_msg(deadline_at=None), "deadline_at"), ("x" * 5000, "larger than"), ("[" * 4000, "not JSON"),
])
def test_malformed_messages_are_rejected_with_a_reason(body: object, reason: str) -> None:
    with pytest.raises(MessageError, match=reason):
        parse_message(body)


def test_interpret_status_with_and_without_hints() -> None:
    p = interpret_status({"job": {"status": "running", "next_poll_after_seconds": 4}})
    assert isinstance(p, Pending) and p.next_poll_after == 4 and not p.unknown_status
    t = interpret_status({"job": {"status": "completed"}})
    assert isinstance(t, Terminal) and t.status == "completed" and t.result_ready
    t = interpret_status({"job": {"status": "completed", "terminal": True, "result_ready": False}})
    assert isinstance(t, Terminal) and not t.result_ready
    assert isinstance(interpret_status({"status": "completed", "terminal": False}), Pending)
    f = interpret_status({"job": {"status": "Cancelled", "error": {"code": "canceled", "message": "by user"}}})
    assert isinstance(f, Terminal) and f.status == "canceled" and f.error == {"code": "canceled", "message": "by user"}
    u = interpret_status({"job": {"status": "mystery"}})
    assert isinstance(u, Pending) and u.unknown_status
    w = interpret_status({"job": {"status": "mystery", "terminal": True}})
    assert isinstance(w, Terminal) and w.status == "failed" and w.sume_status == "mystery"


@pytest.mark.parametrize("body", [None, [], "x", {"job": {}}, {"job": {"status": 3}}, {"status": "  "}])
def test_interpret_garbage_is_retryable(body: object) -> None:
    assert isinstance(interpret_status(body), Retryable)


def test_interpret_ignores_bad_hints() -> None:
    p = interpret_status({"job": {"status": "queued", "next_poll_after_seconds": -3}})
    assert isinstance(p, Pending) and p.next_poll_after is None
    p = interpret_status({"job": {"status": "queued", "next_poll_after_seconds": True}})
    assert isinstance(p, Pending) and p.next_poll_after is None


def test_extract_job_ids_accepts_every_documented_shape() -> None:
    assert extract_job_ids({"job": {"id": "job_a"}}) == ("job_a",)
    assert extract_job_ids({"job_id": "job_b"}) == ("job_b",)
    assert extract_job_ids({"job_ids": ["job_c", "job_d", "job_c"]}) == ("job_c", "job_d")
    assert extract_job_ids({"jobs": [{"id": "job_e"}]}) == ("job_e",)
    assert extract_job_ids({"nothing": 1}) == () and extract_job_ids("x") == ()


def test_parse_retry_after() -> None:
    assert parse_retry_after("12") == 12 and parse_retry_after("0.5") == 0.5
    assert parse_retry_after("-3") == 0 and parse_retry_after("99999") == 3600
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert parse_retry_after("nan") is None
    assert 59 <= (parse_retry_after("Wed, 02 Dec 2026 12:01:00 GMT", now=1796212800.0) or 0) <= 61


def test_settings_validated_once_with_every_problem_named() -> None:
    s = load_settings(BASE_ENV)
    assert s.sume_base_url == "https://sume.test/api/v1" and s.max_delay_seconds == 900
    bad = {**BASE_ENV, "REDIS_URL": "http://x", "MAX_DELAY_SECONDS": "901", "PENDING_SHARDS": "x",
           "SUME_API_KEY_SOURCE": "env"}
    del bad["JOBS_TABLE"]
    with pytest.raises(ConfigError) as err:
        load_settings(bad)
    text = str(err.value)
    for part in ("JOBS_TABLE", "REDIS_URL", "MAX_DELAY_SECONDS", "PENDING_SHARDS", "SUME_API_KEY_SOURCE"):
        assert part in text


def test_redis_password_is_redacted_for_logs() -> None:
    assert redact_url("rediss://:s3cret@cache.example:6380/0") == "rediss://***@cache.example:6380/0"
    assert redact_url("redis://127.0.0.1:6379") == "redis://127.0.0.1:6379"
