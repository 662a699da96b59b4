"""Jobs run through the template's real handlers: real redis-server, moto server over HTTP
(tables and queues made from template.yaml's own properties) and the Sume simulator."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest

from sume_poller.messages import PollMessage
from tools.localrun import LocalSystem

pytestmark = pytest.mark.integration


def chains(system: LocalSystem, job_id: str) -> set[str]:
    """Distinct lease tokens carried by the messages delivered for ``job_id``."""
    tokens = set()
    for body in system.seen_bodies:
        try:
            data = json.loads(body)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("job_id") == job_id and data.get("token"):
            tokens.add(data["token"])
    return tokens


OUTCOMES = ["completed", "failed", "canceled", "expired", "succeeded", "cancelled"]


def test_jobs_run_from_pending_to_each_terminal_status(system: LocalSystem) -> None:
    submitted = {}
    for i, outcome in enumerate(OUTCOMES):
        kind = "video" if i % 2 else "image"
        reply = system.submit(kind, {"prompt": f"p{i}", "sim": {"outcome": outcome, "duration": 3, "steps": 2}})
        assert reply["status"] == "submitted" and len(reply["new"]) == 1
        submitted[reply["job_ids"][0]] = outcome
    system.run_until(lambda: system.all_terminal(submitted), timeout=60)

    expected = {"completed": "completed", "succeeded": "completed", "failed": "failed",
                "canceled": "canceled", "cancelled": "canceled", "expired": "expired"}
    records = system.jobs(submitted)
    events = system.drain_events()
    assert Counter(e["job_id"] for e in events) == Counter(list(submitted))
    stats = system.sim_stats()
    assert stats["creates"] == len(OUTCOMES)
    for job_id, outcome in submitted.items():
        rec = records[job_id]
        assert rec["status"] == expected[outcome], rec
        assert "pending_shard" not in rec and "event_pending" not in rec
        sim = system.sim_job(job_id)
        assert sim["result_reads"] == (1 if expected[outcome] == "completed" else 0)
        assert ("result_json" in rec) == (expected[outcome] == "completed")
        assert sim["status_reads"] <= sim["min_reads"], sim  # hints obeyed: never more than needed
        assert len(chains(system, job_id)) <= 1
        if expected[outcome] != "completed":
            assert rec["error"]["code"]
    assert {e["status"] for e in events} == set(expected.values())
    assert system.queue_depth() == 0 and system.queue_depth(system.dlq_url) == 0


def wait_for(condition, timeout: float = 15.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    """Poll ``condition`` until true or fail at the deadline (no fixed sleeps)."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def fanout_message(job_id: str, kind: str = "image", due_at: float = 0.0, deadline_at: int = 4_102_444_800) -> str:
    return PollMessage(job_id=job_id, kind=kind, deadline_at=deadline_at, due_at=due_at).to_json()


class Crash(BaseException):
    """Stands for the Lambda process dying at a step: nothing after it runs, no batch response."""


def crash_at(step: str):  # type: ignore[no-untyped-def]
    def checkpoint(name: str, job_id: str) -> None:
        if name == step:
            raise Crash(f"{step} {job_id}")
    return checkpoint


# -- submit ------------------------------------------------------------------------------------
def test_submit_is_idempotent_and_a_replay_bills_once(system: LocalSystem) -> None:
    event = {"kind": "image", "params": {"prompt": "same"}, "idempotency_key": "order-42-image"}
    first = system.invoke("SubmitFunction", event)
    second = system.invoke("SubmitFunction", event)
    assert first["job_ids"] == second["job_ids"] and first["new"] == first["job_ids"] and second["new"] == []
    stats = system.sim_stats()
    assert stats["creates"] == 1 and stats["replays"] == 1
    assert len(system.jobs(first["job_ids"])) == 1


def test_submit_retries_an_unknown_outcome_with_the_same_key(system: LocalSystem) -> None:
    # The first create times out after Sume created the job (read timeout 1.5 s < 2.5 s).
    reply = system.submit("image", {"sim": {"create_faults": ["slow:2500"], "duration": 1}})
    assert reply["status"] == "submitted" and len(reply["job_ids"]) == 1
    stats = system.sim_stats()
    assert stats["create_requests"] == 2 and stats["creates"] == 1 and stats["replays"] == 1
    reply = system.submit("video", {"sim": {"create_faults": ["503:1"], "duration": 1}})
    assert reply["status"] == "submitted"
    assert system.sim_stats()["creates"] == 2


def test_submit_402_is_final_and_bad_events_are_rejected(system: LocalSystem) -> None:
    reply = system.submit("image", {"sim": {"insufficient_credits": True}})
    assert reply["status"] == "rejected" and reply["error"] == "insufficient_credits" and reply["job_ids"] == []
    assert system.sim_stats()["create_requests"] == 1  # no retry loop on 402
    for event in ([1], {"kind": "audio"}, {"kind": "image", "params": "x"},
                  {"kind": "image", "idempotency_key": "short"}, {"kind": "image", "job_id": "../etc"}):
        assert system.invoke("SubmitFunction", event)["status"] == "rejected"
    assert system.sim_stats()["create_requests"] == 1 and system.pending_count() == 0


def test_register_existing_job_and_face_swap_with_several_ids(system: LocalSystem) -> None:
    seeded = system.sim_seed("video", {"duration": 2, "steps": 1})
    reg = system.invoke("SubmitFunction", {"kind": "video", "job_id": seeded})
    again = system.invoke("SubmitFunction", {"kind": "video", "job_id": seeded})
    assert reg["status"] == "registered" and reg["new"] == [seeded] and again["new"] == []
    swap = system.submit("face_swap", {"sim": {"duration": 1, "count": 3}})
    assert len(swap["job_ids"]) == 3
    ids = [seeded, *swap["job_ids"]]
    system.run_until(lambda: system.all_terminal(ids), timeout=60)
    assert {r["status"] for r in system.jobs(ids).values()} == {"completed"}
    assert sorted(e["job_id"] for e in system.drain_events()) == sorted(ids)
    assert system.sim_stats()["creates"] == 1


# -- the lease chain -----------------------------------------------------------------------------
def test_two_chains_racing_for_one_job_end_with_one(system: LocalSystem) -> None:
    job = system.sim_seed("image", {"duration": 6, "steps": 3})
    system.invoke("SubmitFunction", {"kind": "image", "job_id": job})  # first poll queued with a delay
    for _ in range(3):  # three more chain starters arrive at once
        system.send(fanout_message(job))
    system.fanout()  # and fan-out, which also sees a free lease
    system.run_until(lambda: system.all_terminal([job]), timeout=60)
    sim = system.sim_job(job)
    assert len(chains(system, job)) == 1
    assert sim["status_reads"] <= sim["min_reads"]
    assert len(system.drain_events()) == 1
    system.run_until(lambda: system.queue_depth() == 0, timeout=30)  # the losers dropped themselves


def test_a_stale_chain_loses_to_the_chain_that_took_over(system: LocalSystem, rdb) -> None:  # type: ignore[no-untyped-def]
    job = system.sim_seed("image", {"duration": 5, "steps": 2})
    system.record(job)
    system.send(fanout_message(job))
    assert system.pump() == 1  # chain A reads once and re-queues itself with a delay
    assert system.sim_job(job)["status_reads"] == 1
    held: list[dict] = []  # chain A's re-queued message, held back (taken off the queue)
    wait_for(lambda: bool(held) or bool(held.extend(system.receive())), what="chain A's re-queued message")
    for m in held:
        system.sqs.delete_message(QueueUrl=system.queue_url, ReceiptHandle=m["ReceiptHandle"])
    a_message = [m["Body"] for m in held]
    rdb.delete(f"sume:poll:{job}")  # its lease vanishes (as after a failover)...
    system.send(fanout_message(job))  # ...and fan-out starts chain B while A's message is held back
    system.run_until(lambda: system.all_terminal([job]), timeout=60)
    assert len(system.drain_events()) == 1
    reads = system.sim_job(job)["status_reads"]
    for body in a_message:  # chain A's re-queued message finally arrives: it must drop itself
        system.send(body)
    system.run_until(lambda: system.queue_depth() == 0, timeout=30)
    assert system.sim_job(job)["status_reads"] == reads


def test_duplicate_messages_for_a_finished_job_change_nothing(system: LocalSystem) -> None:
    job = system.submit("image", {"sim": {"duration": 2, "steps": 1}})["job_ids"][0]
    system.run_until(lambda: system.all_terminal([job]), timeout=60)
    before, sim_before = system.jobs([job])[job], system.sim_job(job)
    assert len(system.drain_events()) == 1
    old = [b for b in system.seen_bodies if json.loads(b)["job_id"] == job]
    for body in [*old, *old, fanout_message(job)]:
        system.send(body)
    system.run_until(lambda: system.queue_depth() == 0, timeout=30)
    assert system.jobs([job])[job] == before
    after = system.sim_job(job)
    assert (after["status_reads"], after["result_reads"]) == (sim_before["status_reads"], sim_before["result_reads"])
    assert system.drain_events() == []


def test_every_message_delivered_twice_in_one_batch_reads_once(system: LocalSystem) -> None:
    ids = [system.submit("image", {"n": i, "sim": {"duration": 4, "steps": 2}})["job_ids"][0] for i in range(5)]
    system.run_until(lambda: system.all_terminal(ids), timeout=60, duplicate=True)
    assert system.stats.duplicates_delivered > 0
    for job in ids:
        sim = system.sim_job(job)
        assert sim["status_reads"] <= sim["min_reads"] and sim["result_reads"] == 1
    assert sorted(e["job_id"] for e in system.drain_events()) == sorted(ids)


@pytest.mark.parametrize("step", ["claimed", "read", "renewed", "requeued"])
def test_a_crashed_poller_is_resumed_by_fanout_after_the_lease_expires(system: LocalSystem, rdb, step: str) -> None:  # type: ignore[no-untyped-def]
    job = system.sim_seed("image", {"duration": 4, "steps": 2})
    system.record(job, "image")
    system.send(fanout_message(job))
    messages: list[dict] = []
    wait_for(lambda: bool(messages) or bool(messages.extend(system.receive())), what="the poll message")
    with pytest.raises(Crash):
        system.deliver(messages, poller=system.poller(checkpoint=crash_at(step)))
    # The crashed invocation deleted nothing; its message waits out the visibility timeout.
    # Recovery: the lease expires, then fan-out sees the job pending without a live lease.
    wait_for(lambda: not rdb.exists(f"sume:poll:{job}"), timeout=20, what="lease expiry")
    assert system.fanout()["sent"] in (0, 1)
    system.run_until(lambda: system.all_terminal([job]), timeout=60, fanout_every=3)
    events = system.drain_events()
    assert [e["job_id"] for e in events] == [job]
    assert system.jobs([job])[job]["status"] == "completed"


def test_crash_between_terminal_write_and_event_is_finished_by_the_next_attempt(system: LocalSystem, rdb) -> None:  # type: ignore[no-untyped-def]
    job = system.sim_seed("image", {"duration": 0.2, "steps": 1})
    system.record(job, "image")
    wait_for(lambda: system.sim_job(job)["status"] == "completed", what="the job to finish at Sume")
    system.send(fanout_message(job, due_at=0))
    messages: list[dict] = []
    wait_for(lambda: bool(messages) or bool(messages.extend(system.receive())), what="the poll message")
    with pytest.raises(Crash):
        system.deliver(messages, poller=system.poller(checkpoint=crash_at("written")))
    record = system.jobs([job])[job]
    assert record["status"] == "completed" and record["event_pending"] is True
    assert system.drain_events() == []
    reads = system.sim_job(job)
    # SQS redelivers the message after its visibility timeout (fast-forwarded here).
    wait_for(lambda: not rdb.exists(f"sume:poll:{job}"), timeout=20, what="lease expiry")
    for m in messages:
        system.sqs.change_message_visibility(QueueUrl=system.queue_url, ReceiptHandle=m["ReceiptHandle"],
                                             VisibilityTimeout=0)
    system.run_until(lambda: "event_pending" not in system.jobs([job])[job], timeout=30)
    assert [e["job_id"] for e in system.drain_events()] == [job]
    after = system.sim_job(job)
    assert (after["status_reads"], after["result_reads"]) == (reads["status_reads"], reads["result_reads"])


# -- delays ------------------------------------------------------------------------------------
def test_a_delay_over_900_seconds_hops_without_reading_sume(system: LocalSystem, rdb) -> None:  # type: ignore[no-untyped-def]
    job = system.sim_seed("video", {"duration": 30})
    system.record(job, "video")
    system.send(fanout_message(job, kind="video", due_at=time.time() + 2000))
    assert system.pump() == 1
    attrs = system.sqs.get_queue_attributes(QueueUrl=system.queue_url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesDelayed"] == "1"  # moto rejects DelaySeconds > 900
    assert system.sim_job(job)["status_reads"] == 0
    ttl = rdb.pttl(f"sume:poll:{job}") / 1000
    assert 900 < ttl <= 902  # lease renewed to the hop plus the margin (2 s in tests)
    with pytest.raises(system.sqs.exceptions.ClientError):
        system.sqs.send_message(QueueUrl=system.queue_url, MessageBody="x", DelaySeconds=901)


def test_hops_chain_until_due_then_read(system: LocalSystem) -> None:
    # With hops capped at 1 s, Sume's 5 s hint is covered by hops; Sume is read twice in all.
    job = system.sim_seed("image", {"duration": 5, "steps": 1})
    system.record(job, "image")
    system.send(fanout_message(job))
    short_hops = system.poller(max_delay_seconds=1)
    system.run_until(lambda: system.all_terminal([job]), timeout=60, poller=short_hops)
    assert system.sim_job(job)["status_reads"] == 2
    hops = [json.loads(b) for b in system.seen_bodies]
    assert len(hops) >= 5 and max(h["attempt"] for h in hops) == 1


def test_429_and_5xx_become_delays_and_never_reach_the_dlq(system: LocalSystem, rdb) -> None:  # type: ignore[no-untyped-def]
    from sume_poller.messages import parse_message

    job = system.sim_seed("image", {"duration": 0.5, "faults": ["429:7"]})
    system.record(job)
    outcome = system.poller().process(parse_message(fanout_message(job)))
    assert outcome.name == "transient" and outcome.delay == 7  # Retry-After is the re-queue delay
    assert 7 < rdb.pttl(f"sume:poll:{job}") / 1000 <= 9

    faulty = system.sim_seed("image", {"duration": 0.5, "faults": ["503:1", "500", "502", "malformed", "429:1"]})
    system.invoke("SubmitFunction", {"kind": "image", "job_id": faulty})
    system.run_until(lambda: system.all_terminal([faulty]), timeout=90)
    assert system.jobs([faulty])[faulty]["status"] == "completed"
    assert system.sim_job(faulty)["status_reads"] == 6
    assert system.stats.failures == 0 and system.queue_depth(system.dlq_url) == 0


# -- bad input -------------------------------------------------------------------------------------
def test_malformed_messages_fail_alone_not_their_batch(system: LocalSystem) -> None:
    job = system.sim_seed("image", {"duration": 30})
    system.record(job, "image")
    for body in ["not json", fanout_message("bad id with spaces"), fanout_message(job), '{"v": 1}']:
        system.send(body)
    messages = []
    wait_for(lambda: len(messages) == 4 or bool(messages.extend(system.receive())), what="4 messages")
    reply = system.deliver(messages, fast_retry=True)
    failed = {f["itemIdentifier"] for f in reply["batchItemFailures"]}
    bodies = {m["MessageId"]: m["Body"] for m in messages}
    assert sorted(bodies[i] for i in failed) == sorted(["not json", fanout_message("bad id with spaces"), '{"v": 1}'])
    assert system.sim_job(job)["status_reads"] == 1
    # Poison ends in the dead-letter queue after maxReceiveCount (5) receives; nothing is lost.
    system.run_until(lambda: system.queue_depth(system.dlq_url) == 3, timeout=60)


def test_a_job_past_its_deadline_or_attempt_cap_is_recorded_timed_out(system: LocalSystem) -> None:
    from sume_poller import runtime

    store = runtime.job_store()
    settings = runtime.settings()
    for job, deadline, attempt in (("job_late", int(time.time()) - 1, 0),
                                   ("job_busy", 4_102_444_800, settings.max_poll_attempts)):
        system.sim_seed("image", {"duration": 300}, job_id=job)
        assert store.put_pending(job, "image", deadline, settings.pending_shards)
        body = json.loads(fanout_message(job, deadline_at=deadline))
        system.send(json.dumps({**body, "attempt": attempt}))
    system.run_until(lambda: system.all_terminal(["job_late", "job_busy"]), timeout=30)
    records = system.jobs(["job_late", "job_busy"])
    assert records["job_late"]["error"]["code"] == "deadline_exceeded"
    assert records["job_busy"]["error"]["code"] == "attempts_exceeded"
    assert {r["status"] for r in records.values()} == {"timed_out"}
    assert system.sim_job("job_late")["status_reads"] == 0
    assert sorted(e["status"] for e in system.drain_events()) == ["timed_out", "timed_out"]


# -- fan-out -------------------------------------------------------------------------------------
def test_fanout_sends_only_unleased_jobs_ten_per_batch(system: LocalSystem, rdb) -> None:  # type: ignore[no-untyped-def]
    from sume_poller import runtime
    from sume_poller.fanout import run_fanout

    store, settings = runtime.job_store(), runtime.settings()
    ids = [f"job_fan_{i:03d}" for i in range(45)]
    for job in ids:
        assert store.put_pending(job, "image", 4_102_444_800, settings.pending_shards)
    for job in ids[:7]:
        rdb.set(f"sume:poll:{job}", "someone:1", px=60_000)
    calls = []
    lease = runtime.lease_store()
    original = lease.live
    lease.live = lambda job_ids: calls.append(len(job_ids)) or original(job_ids)  # type: ignore[method-assign]
    try:
        report = run_fanout(settings, store, runtime.poll_queue(), lease, lambda: 60_000, page_size=10)
    finally:
        lease.live = original  # type: ignore[method-assign]
    assert (report.pending_seen, report.leased, report.sent, report.send_failed) == (45, 7, 38, 0)
    assert report.pages == len(calls) + sum(1 for _ in range(0)) or report.pages >= len(calls)
    assert len(calls) == sum(1 for n in calls if n)  # one pipelined round trip per non-empty page
    sent = []
    wait_for(lambda: len(sent) >= 38 or bool(sent.extend(system.receive())), what="38 messages")
    assert sorted(json.loads(m["Body"])["job_id"] for m in sent) == sorted(ids[7:])


def test_fanout_sends_nothing_when_redis_is_down_or_auth_is_paused(system: LocalSystem) -> None:
    import redis as redis_lib

    from sume_poller import runtime
    from sume_poller.fanout import run_fanout
    from sume_poller.lease import LeaseStore
    from tools.services import free_port

    store, settings = runtime.job_store(), runtime.settings()
    assert store.put_pending("job_fan_x", "image", 4_102_444_800, settings.pending_shards)
    dead = LeaseStore(redis_lib.Redis(port=free_port(), socket_connect_timeout=0.5), settings.lease_key_prefix)
    report = run_fanout(settings, store, runtime.poll_queue(), dead, lambda: 60_000)
    assert report.redis_unavailable and report.sent == 0
    runtime.lease_store().pause_auth(30)
    report = run_fanout(settings, store, runtime.poll_queue(), runtime.lease_store(), lambda: 60_000)
    assert report.auth_paused and report.sent == 0
    assert system.queue_depth() == 0


def test_a_rejected_api_key_stops_polling_loudly(system: LocalSystem, caplog) -> None:  # type: ignore[no-untyped-def]
    job = system.sim_seed("image", {"duration": 1})
    system.record(job, "image")
    system.sim_config(api_key="sume_rotated_key")
    system.send(fanout_message(job))
    assert system.pump() == 1
    assert system.queue_depth() == 0  # the chain stopped: no re-queue, no spin
    assert system.fanout()["auth_paused"] is True
    assert system.jobs([job])[job]["status"] == "pending"
    assert any("rejected the API key" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


def test_a_batch_stops_before_the_timeout_and_reports_unfinished_records(system: LocalSystem) -> None:
    from sume_poller.poller import handle_batch

    slow = system.sim_seed("image", {"duration": 30, "faults": ["slow:1400"]})
    fast = [system.sim_seed("image", {"duration": 30}) for _ in range(4)]
    for job in [slow, *fast]:
        system.record(job)
        system.send(fanout_message(job))
    messages: list[dict] = []
    wait_for(lambda: len(messages) == 5 or bool(messages.extend(system.receive())), what="5 messages")
    poller = system.poller()
    records = [system.sqs_record(m) for m in messages]
    # 3 s safety margin + 0.5 s: the batch may work for 0.5 s; the slow Sume reply takes 1.4 s.
    reply = handle_batch({"Records": records}, lambda: poller.s.safety_margin_ms + 500, poller)
    body = {m["MessageId"]: json.loads(m["Body"])["job_id"] for m in messages}
    assert [body[f["itemIdentifier"]] for f in reply["batchItemFailures"]] == [slow]
    assert all(system.sim_job(j)["status_reads"] == 1 for j in fast)


def test_one_message_makes_one_sume_read_even_when_the_read_times_out(system: LocalSystem) -> None:
    from sume_poller.messages import parse_message

    job = system.sim_seed("image", {"duration": 30, "faults": ["slow:2500"]})  # > SUME_READ_TIMEOUT 1.5 s
    system.record(job)
    outcome = system.poller().process(parse_message(fanout_message(job)))
    assert outcome.name == "transient" and outcome.delay is not None
    wait_for(lambda: system.sim_job(job)["status_reads"] >= 1, what="the slow read to land")
    assert system.sim_job(job)["status_reads"] == 1


def test_fanout_retries_failed_entries_and_stops_before_its_timeout(system: LocalSystem) -> None:
    from sume_poller import runtime
    from sume_poller.fanout import run_fanout

    store, settings, queue = runtime.job_store(), runtime.settings(), runtime.poll_queue()
    ids = [f"job_retry_{i:02d}" for i in range(25)]
    for job in ids:
        system.record(job)

    class FlakyQueue:
        """The real queue, except that SendMessageBatch drops two entries on its first call."""

        calls = 0
        lock = threading.Lock()  # fan-out sends on several threads

        def send_batch(self, entries):  # type: ignore[no-untyped-def]
            with FlakyQueue.lock:
                FlakyQueue.calls += 1
                first = FlakyQueue.calls == 1
            failed = queue.send_batch(entries[2:] if first else entries)
            return ([e[0] for e in entries[:2]] + failed) if first else failed

    report = run_fanout(settings, store, FlakyQueue(), runtime.lease_store(), lambda: 60_000,  # type: ignore[arg-type]
                        sleep=lambda s: None)
    assert (report.sent, report.send_failed, report.batches) == (25, 0, 4)  # 3 full-or-last batches + 1 retry
    got: list[dict] = []
    wait_for(lambda: len(got) >= 25 or bool(got.extend(system.receive())), what="25 messages")
    assert sorted(json.loads(m["Body"])["job_id"] for m in got) == ids

    budget = iter([60_000, 60_000, 10])  # two pages' worth of time, then the margin is reached
    report = run_fanout(settings, store, queue, runtime.lease_store(), lambda: next(budget, 0), page_size=5)
    assert report.stopped_early and report.pages == 2


def test_an_unpublished_event_is_found_by_fanout_when_the_message_is_gone(system: LocalSystem, rdb) -> None:  # type: ignore[no-untyped-def]
    # The poller dies after the terminal write and its message never comes back (say it went to
    # the DLQ on its last receive): the job sits in the index's outbox partition, so fan-out sends
    # it again and the next poll publishes the event - without reading Sume.
    job = system.sim_seed("image", {"duration": 0.2, "steps": 1})
    system.record(job)
    wait_for(lambda: system.sim_job(job)["status"] == "completed", what="the job to finish at Sume")
    system.send(fanout_message(job))
    messages: list[dict] = []
    wait_for(lambda: bool(messages) or bool(messages.extend(system.receive())), what="the poll message")
    with pytest.raises(Crash):
        system.deliver(messages, poller=system.poller(checkpoint=crash_at("written")))
    for m in messages:  # the message is gone for good
        system.sqs.delete_message(QueueUrl=system.queue_url, ReceiptHandle=m["ReceiptHandle"])
    assert system.jobs([job])[job]["pending_shard"].startswith("o")
    reads = system.sim_job(job)
    wait_for(lambda: not rdb.exists(f"sume:poll:{job}"), timeout=20, what="lease expiry")
    assert system.fanout()["sent"] == 1
    system.run_until(lambda: system.all_terminal([job]), timeout=30)
    assert [e["job_id"] for e in system.drain_events()] == [job]
    record = system.jobs([job])[job]
    assert "event_pending" not in record and "pending_shard" not in record
    assert system.sim_job(job)["status_reads"] == reads["status_reads"]


def test_a_far_hint_never_outlives_the_deadline(system: LocalSystem) -> None:
    from sume_poller import runtime

    job = system.sim_seed("video", {"duration": 3600, "steps": 1})  # hint: come back in an hour
    deadline = int(time.time()) + 3
    assert runtime.job_store().put_pending(job, "video", deadline, runtime.settings().pending_shards)
    system.send(fanout_message(job, kind="video", deadline_at=deadline))
    system.run_until(lambda: system.all_terminal([job]), timeout=30)
    record = system.jobs([job])[job]
    assert record["status"] == "timed_out" and record["error"]["code"] == "deadline_exceeded"
    assert system.sim_job(job)["status_reads"] == 1


def test_messages_arriving_during_the_auth_pause_do_not_read_sume(system: LocalSystem) -> None:
    jobs = [system.sim_seed("image", {"duration": 60}) for _ in range(3)]
    for job in jobs:
        system.record(job)
    system.sim_config(api_key="sume_rotated_key")
    for job in jobs:
        system.send(fanout_message(job))
    system.run_until(lambda: system.queue_depth() == 0, timeout=30)
    assert system.sim_stats()["unauthorized"] >= 1
    rejected = system.sim_stats()["unauthorized"]
    for job in jobs:  # duplicates or late starters arrive while the pause lives
        system.send(fanout_message(job))
    system.run_until(lambda: system.queue_depth() == 0, timeout=30)
    assert system.sim_stats()["unauthorized"] == rejected
    assert all(r["status"] == "pending" for r in system.jobs(jobs).values())
