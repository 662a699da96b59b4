"""The job store (store.py) on moto server over HTTP: the exactly-once terminal write, the outbox,
the Redis-down fence, observations, results of any shape and size, and plain JSON numbers."""

from __future__ import annotations

import json

import boto3
import pytest

from sume_poller.store.records import (
    INLINE_RESULT_BYTES,
    PAGE_FIELDS,
    STATS_SLOTS,
    Ending,
    JobStore,
    ResultBucket,
    from_item,
)
from tools.template import Provisioned

pytestmark = pytest.mark.integration
NOW = 1_800_000_000.0


@pytest.fixture
def store(template_resources: Provisioned) -> JobStore:
    return JobStore("jobs", 4, results=ResultBucket("results"))


def test_the_terminal_write_wins_once_and_the_loser_sees_the_record(store: JobStore) -> None:
    assert store.put_pending("job_1", "video", now=NOW, deadline_at=int(NOW) + 60, chain_due_at=NOW + 2.5)
    assert not store.put_pending("job_1", "video", now=NOW, deadline_at=int(NOW) + 60)
    ending = Ending("completed", "succeeded", None, store.result_fields("job_1", {"url": "u"}), 3, 1, NOW + 10.5,
                    NOW + 20.25)
    won = store.record_terminal("job_1", ending, now=NOW + 21)
    assert won.won and won.record is not None and won.record["pending_shard"].startswith("o")
    lost = store.record_terminal("job_1", Ending("failed"), now=NOW + 22)
    assert not lost.won and lost.record is not None and lost.record["status"] == "completed"
    assert store.clear_outbox("job_1", now=NOW + 23) and not store.clear_outbox("job_1", now=NOW + 24)
    record = store.get("job_1")
    assert record is not None and "pending_shard" not in record and "event_pending" not in record
    assert json.loads(record["result_json"]) == {"url": "u"}
    assert type(record["reads"]) is int and record["seen_terminal_at"] == NOW + 20.25  # plain numbers, not Decimal
    assert store.record_terminal("job_missing", Ending("failed"), now=NOW).record is None


def test_many_records_are_read_whole_or_only_the_fields_asked_for(store: JobStore) -> None:
    """A sweep reads a listed job's record without its result (inline up to 100 KB); "status" and "key"
    are DynamoDB reserved words, so the projection names them through placeholders."""
    store.put_pending("job_m1", "image", now=NOW, deadline_at=int(NOW) + 60)
    store.put_pending("job_m2", "video", now=NOW, deadline_at=int(NOW) + 60)
    store.record_terminal("job_m2", Ending("completed", result=store.result_fields("job_m2", {"u": "x" * 1000})),
                          now=NOW)
    whole = store.get_many(["job_m1", "job_m2", "job_none"])
    assert set(whole) == {"job_m1", "job_m2"} and "result_json" in whole["job_m2"]
    some = store.get_many(["job_m1", "job_m2"], ("status", "key", "kind"))
    assert some == {"job_m1": {"job_id": "job_m1", "status": "pending", "kind": "image"},
                    "job_m2": {"job_id": "job_m2", "status": "completed", "kind": "video"}}


@pytest.mark.parametrize("result", [[{"url": "a"}, {"url": "b"}], "https://x/y", 42, None])
def test_any_json_result_is_stored_whole(store: JobStore, result: object) -> None:
    store.put_pending("job_r", "image", now=NOW, deadline_at=int(NOW) + 60)
    store.record_terminal("job_r", Ending("completed", result=store.result_fields("job_r", result)), now=NOW)
    assert json.loads(store.get("job_r")["result_json"]) == result  # type: ignore[index]


def test_a_large_result_goes_to_s3_whole_and_the_record_keeps_the_pointer(store: JobStore) -> None:
    big = {"frames": ["x" * 1000] * 400}
    store.put_pending("job_big", "video", now=NOW, deadline_at=int(NOW) + 60)
    fields = store.result_fields("job_big", big)
    record = store.record_terminal("job_big", Ending("completed", result=fields), now=NOW).record
    assert record is not None and "result_json" not in record and record["result_bytes"] > INLINE_RESULT_BYTES
    body = boto3.client("s3").get_object(Bucket="results", Key=record["result_s3_key"])["Body"].read()
    assert json.loads(body) == big


def tags(key: str) -> dict[str, str]:
    reply = boto3.client("s3").get_object_tagging(Bucket="results", Key=key)
    return {t["Key"]: t["Value"] for t in reply["TagSet"]}


def test_racing_attempts_write_objects_of_their_own_and_the_record_points_at_the_winners(store: JobStore) -> None:
    """Two attempts fetched the result (a signed URL differs per fetch) and both stored it: each
    under a key of its own, tagged unclaimed. The winner's write points at its object, the outbox
    claims it; the loser removes its own (or the lifecycle rule on the tag expires it)."""
    bucket = store.results
    assert bucket is not None
    store.put_pending("job_race", "video", now=NOW, deadline_at=int(NOW) + 60)
    first = bucket.put("job_race", b'{"url": "https://cdn/a?sig=1"}' * 5_000)
    second = bucket.put("job_race", b'{"url": "https://cdn/a?sig=2"}' * 4_000)
    assert first["result_s3_key"] != second["result_s3_key"] and tags(first["result_s3_key"]) == {
        "sume-poller-attempt": "unclaimed"}
    won = store.record_terminal("job_race", Ending("completed", result=first), now=NOW)
    lost = store.record_terminal("job_race", Ending("completed", result=second), now=NOW)
    assert won.won and not lost.won and lost.record is not None
    bucket.discard(second["result_s3_key"])
    bucket.claim(lost.record["result_s3_key"])
    s3 = boto3.client("s3")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="results", Prefix="results/job_race/")["Contents"]]
    assert keys == [first["result_s3_key"]] and tags(first["result_s3_key"]) == {}
    body = s3.get_object(Bucket="results", Key=first["result_s3_key"])["Body"].read()
    assert len(body) == store.get("job_race")["result_bytes"]  # type: ignore[index]  # the record and its object agree


def test_the_fence_lets_one_step_of_one_chain_read_while_redis_is_down(store: JobStore) -> None:
    store.put_pending("job_f", "image", now=NOW, deadline_at=int(NOW) + 60)
    assert store.fence("job_f", "a" * 32, 3, now=NOW, hold=60).won
    assert not store.fence("job_f", "a" * 32, 3, now=NOW, hold=60).won  # a duplicate of step 3
    assert store.fence("job_f", "a" * 32, 4, now=NOW, hold=60).won  # the chain's next step
    # Another chain of the job (started after a lease lapsed) reads only once the holder's hold passed.
    assert not store.fence("job_f", "b" * 32, 0, now=NOW + 59, hold=60).won
    assert store.fence("job_f", "b" * 32, 0, now=NOW + 60, hold=60).won
    assert store.get("job_f")["chain_due_at"] == NOW + 120  # type: ignore[index]
    assert not store.fence("job_f", "a" * 32, 5, now=NOW + 61, hold=60).won  # the first chain, now fenced out
    store.record_terminal("job_f", Ending("failed"), now=NOW + 61)
    lost = store.fence("job_f", "b" * 32, 1, now=NOW + 61, hold=60)
    assert not lost.won and lost.record is not None and lost.record["event_pending"]


def test_observations_take_one_slot_per_job_so_a_repeat_counts_once(store: JobStore) -> None:
    for _ in range(2):
        store.put_observation("video", "job_1", 30.0, 45.5, at=NOW)
    store.put_observation("video", "job_2", 10.0, None, at=NOW)
    seen = store.observations("video")
    assert sorted((o["l"], o.get("u")) for o in seen) == [(10.0, None), (30.0, 45.5)]
    for i in range(STATS_SLOTS + 50):
        store.put_observation("image", f"job_{i}", 1.0, 2.0, at=NOW)
    assert len(store.observations("image")) <= STATS_SLOTS


def test_pending_pages_list_only_pending_jobs_and_unfinished_outboxes(store: JobStore) -> None:
    for i in range(5):
        store.put_pending(f"job_{i}", "image", now=NOW, deadline_at=int(NOW) + 60)
    store.record_terminal("job_0", Ending("failed"), now=NOW)
    items = [i for s in range(4) for i in store.pending_page(f"p{s:02d}", None)[0]]
    outbox = [i for s in range(4) for i in store.pending_page(f"o{s:02d}", None)[0]]
    assert sorted(i["job_id"] for i in items) == ["job_1", "job_2", "job_3", "job_4"]
    assert [i["job_id"] for i in outbox] == ["job_0"] and all(type(i["deadline_at"]) is int for i in items)
    # a page returns what fan-out reads, not the partition or the rest of the record (status, reads...)
    assert all({"job_id", "kind", "deadline_at", "submitted_at"} <= set(i) <= set(PAGE_FIELDS)
               for i in items + outbox)
    assert from_item({"n": {"N": "1.5"}, "m": {"M": {"k": {"N": "2"}}}}) == {"n": 1.5, "m": {"k": 2}}


def test_a_finished_record_expires_only_once_its_event_is_out_and_only_with_a_retention(
        template_resources: Provisioned) -> None:
    """RetentionDays: the TTL is set where the outbox is cleared (a record still owing its event
    never expires), in real epoch seconds (tests/unit/test_template_account.py ties EXPIRES_AT to the
    template's TimeToLiveSpecification: moto's CloudFormation does not apply it)."""
    from sume_poller.store.records import DAY_SECONDS, EXPIRES_AT

    wall = 1_790_000_000.0  # the functions' clock may run elsewhere (TimeScale): DynamoDB compares real time
    kept = JobStore("jobs", 4, retention_days=30, wall=lambda: wall)
    for job in ("job_e1", "job_e2"):
        kept.put_pending(job, "image", now=NOW, deadline_at=int(NOW) + 60)
        assert kept.record_terminal(job, Ending("completed"), now=NOW + 1).won
    assert EXPIRES_AT not in kept.get("job_e1")  # type: ignore[operator]  # still owes its event
    assert kept.clear_outbox("job_e1", now=NOW + 2)
    assert kept.get("job_e1")[EXPIRES_AT] == int(wall) + 30 * DAY_SECONDS  # type: ignore[index]
    assert EXPIRES_AT not in kept.get("job_e2")  # type: ignore[operator]
    forever = JobStore("jobs", 4)  # RetentionDays 0
    assert forever.clear_outbox("job_e2", now=NOW + 2) and EXPIRES_AT not in forever.get("job_e2")  # type: ignore[operator]
    kept.put_pending("job_e3", "image", now=NOW, deadline_at=int(NOW) + 60)
    assert not kept.clear_outbox("job_e3", now=NOW + 2)  # a pending job has no outbox: it never expires
    assert EXPIRES_AT not in kept.get("job_e3")  # type: ignore[operator]


def test_creates_are_counted_on_the_submission_record_before_they_are_sent(store: JobStore) -> None:
    from sume_poller.store.submissions import queue_item, queued_record

    # submit's own creates: an attempt record (no status), one answered without creating anything
    assert store.note_create("default", "order-1", None, now=NOW) and store.note_create("default", "order-1", None,
                                                                                        now=NOW + 1)
    store.create_answered("default", "order-1")  # a 429: that one is known
    attempt = store.submission("default", "order-1")
    assert attempt is not None and "status" not in attempt
    assert (attempt["unknown_creates"], attempt["create_attempts"], attempt["last_create_at"]) == (1, 2, NOW + 1)
    # queued over the attempt record, the count carried - only while it is the count read
    item = queue_item("default", kind="image", params={}, idempotency_key="order-1", derived=False, arrived=NOW,
                      deadline_at=NOW + 60)
    assert not store.enqueue(item, queued_record(item), unknown_creates=0)
    assert store.enqueue(item, queued_record(item), unknown_creates=1)
    queued = store.submission("default", "order-1")
    assert queued is not None and (queued["status"], queued["unknown_creates"]) == ("queued", 1)
    # the drain's create of that head, and only of that head
    assert not store.note_create("default", "order-1", "#q:default:another", now=NOW + 2)
    assert store.note_create("default", "order-1", item["job_id"], now=NOW + 2)
    assert store.submission("default", "order-1")["unknown_creates"] == 2  # type: ignore[index]
    # settled: nothing more is sent, nothing more counted
    assert store.settle_submission("default", "order-1", item["job_id"], {"status": "created", "job_ids": ["job_1"]})
    assert not store.note_create("default", "order-1", None, now=NOW + 3)
    assert not store.note_create("default", "order-1", item["job_id"], now=NOW + 3)
    store.create_answered("default", "order-1")
    assert store.submission("default", "order-1")["unknown_creates"] == 2  # type: ignore[index]
    # a direct create settles over its attempt record
    assert store.note_create("default", "order-2", None, now=NOW)
    assert store.put_submission({"job_id": "#sub:default:order-2", "status": "created", "job_ids": ["job_2"]})
    assert not store.put_submission({"job_id": "#sub:default:order-2", "status": "rejected"})
