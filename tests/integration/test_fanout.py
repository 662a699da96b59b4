"""Fan-out (fanout.py) on real Redis and moto: the outbox first, every partition served from a cursor
under a backlog, no job sent twice, no more starts than the budget can serve, nothing while
Redis is down."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import boto3
import pytest
import redis

from sume_poller.core.clock import Clock
from sume_poller.limits.budget import Budget, granted_per_window
from sume_poller.limits.lease import LeaseStore
from sume_poller.poll.fanout import FanOut, FanOutSettings
from sume_poller.store.queue import PollQueue
from sume_poller.store.records import Ending, JobStore, PublishClaim
from tools.services import RedisServer
from tools.template import Provisioned

pytestmark = pytest.mark.integration
NOW = Clock().now()


@pytest.fixture
def parts(template_resources: Provisioned, rdb: redis.Redis,
          redis_server: RedisServer) -> Iterator[dict[str, object]]:
    sqs, url = boto3.client("sqs"), template_resources["PollQueue"]
    env = {"JOBS_TABLE": "jobs", "POLL_QUEUE_URL": url, "REDIS_URL": redis_server.url, "LOCAL_ENDPOINTS": "true",
           "PENDING_SHARDS": "4", "READS_PER_MINUTE": "25", "READS_PER_DAY": "0", "START_LEASE_SECONDS": "600"}
    settings = FanOutSettings.from_env(env)
    clock = settings.common.clock
    yield {"settings": settings, "store": JobStore("jobs", 4), "queue": PollQueue(url, clock),
           "lease": LeaseStore(rdb, "t:"), "budget": Budget(rdb, "t:!budget:reads", 25, 0, clock.now), "sqs": sqs,
           "url": url}


def tick(parts: dict[str, object]) -> FanOut:
    fanout = FanOut(parts["settings"], parts["store"], parts["queue"], parts["lease"], parts["budget"],  # type: ignore[arg-type]
                    lambda: 50_000)
    fanout.run()
    return fanout


def queued(parts: dict[str, object]) -> Counter[str]:
    sqs, url = parts["sqs"], parts["url"]
    seen: Counter[str] = Counter()
    while True:
        reply = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600)  # type: ignore[attr-defined]
        if not reply.get("Messages"):
            return seen
        seen.update(json.loads(m["Body"])["job_id"] for m in reply["Messages"])


def test_under_a_backlog_every_partition_is_served_in_turn_and_no_job_is_sent_twice(parts: dict[str, object]) -> None:
    per_minute = int(granted_per_window(25))  # whole chains of what the line grants a minute at 25/min
    jobs = 3 * per_minute + 4  # three ticks' worth and a few
    store: JobStore = parts["store"]  # type: ignore[assignment]
    for i in range(jobs):
        store.put_pending(f"job_{i:03d}", "image", now=NOW, deadline_at=int(NOW) + 3_600)
    for i in range(3):  # terminal jobs whose event was never published (their message went to the DLQ)
        store.put_pending(f"done_{i}", "image", now=NOW, deadline_at=int(NOW) + 3_600)
        store.record_terminal(f"done_{i}", Ending("failed"), now=NOW)
    reports = [tick(parts).report for _ in range(4)]
    assert reports[0].outbox_sent == 3  # the outbox first (it costs no read)...
    assert reports[1].outbox_sent == 0 and reports[1].outbox_backing_off == 3  # ...then after doubling waits
    per_tick = [r.started for r in reports]
    assert per_tick[:3] == [per_minute] * 3 and sum(per_tick) == jobs  # per 60 s tick
    sent = queued(parts)
    assert {j: n for j, n in sent.items() if j.startswith("job_") and n != 1} == {}
    assert len([j for j in sent if j.startswith("job_")]) == jobs
    assert reports[3].round_complete and reports[0].pending_counted == jobs
    budget: Budget = parts["budget"]  # type: ignore[assignment]
    assert budget.state()["oldest_pending"] == int(NOW)  # how far back sweeps need to page


def test_a_job_whose_chain_runs_without_its_lease_is_left_to_it(parts: dict[str, object]) -> None:
    store: JobStore = parts["store"]  # type: ignore[assignment]
    now = Clock().now()  # not the module's NOW: the outage chain must still be due in the future
    store.put_pending("job_outage", "image", now=now, deadline_at=int(now) + 3_600, chain_due_at=now + 120)
    store.put_pending("job_dead", "image", now=now, deadline_at=int(now) + 3_600, chain_due_at=now - 5)
    report = tick(parts).report
    assert report.started == 1 and report.skipped_unleased_chain == 1
    assert set(queued(parts)) == {"job_dead"}


def test_nothing_is_started_while_redis_is_down(parts: dict[str, object], redis_server: RedisServer) -> None:
    store: JobStore = parts["store"]  # type: ignore[assignment]
    store.put_pending("job_1", "image", now=NOW, deadline_at=int(NOW) + 3_600)
    redis_server.stop()
    try:
        report = tick(parts).report
    finally:
        redis_server.start()
    assert report.redis_unavailable and report.started == 0 and queued(parts) == Counter()


def test_a_fraction_of_a_start_left_ends_the_tick(parts: dict[str, object]) -> None:
    """Regression: with 0.9 of a start left the tick re-read the same page until its timeout."""
    store: JobStore = parts["store"]  # type: ignore[assignment]
    for i in range(30):
        store.put_pending(f"job_{i:03d}", "image", now=NOW, deadline_at=int(NOW) + 3_600)
    fanout = tick(parts)
    report = fanout.report
    assert report.started == int(granted_per_window(25)) and report.pages < 10 and not report.stopped_early


def test_a_tick_that_reads_every_partition_whole_counts_from_its_pages_not_a_second_read(
        parts: dict[str, object]) -> None:
    """The pending count (the budget's reserve, the PendingJobs metric) comes from the pages a tick
    read whole: no Select COUNT query, which DynamoDB bills like reading the records again."""
    store: JobStore = parts["store"]  # type: ignore[assignment]
    lease: LeaseStore = parts["lease"]  # type: ignore[assignment]
    ids = [f"job_{i:03d}" for i in range(30)]
    for job_id in ids:
        store.put_pending(job_id, "image", now=NOW, deadline_at=int(NOW) + 3_600)
    assert all(lease.start_many([(j, "live") for j in ids], 600_000))  # every chain alive: every page read whole
    counts: list[str] = []
    store._ddb.meta.events.register(
        "before-parameter-build.dynamodb.Query", lambda params, **_: counts.append(params.get("Select", "items")))
    report = tick(parts).report
    assert (report.pending_counted, report.leased, report.started) == (30, 30, 0)
    assert "COUNT" not in counts and len(counts) == report.pages  # the 4 outbox and 4 pending partitions' pages
    budget: Budget = parts["budget"]  # type: ignore[assignment]
    assert int(budget.state()["pending"]) == 30


def test_chains_whose_first_message_sqs_refuses_are_not_started_and_keep_no_lease(
        parts: dict[str, object]) -> None:
    """A start whose first message SQS does not take (here: the queue is gone) is undone on the tick's
    thread: its start lease is freed, it counts as send_failed, not started; the next tick tries again."""
    store: JobStore = parts["store"]  # type: ignore[assignment]
    lease: LeaseStore = parts["lease"]  # type: ignore[assignment]
    sqs = parts["sqs"]
    ids = [f"job_{i:03d}" for i in range(12)]
    for job_id in ids:
        store.put_pending(job_id, "image", now=NOW, deadline_at=int(NOW) + 3_600)
    gone = sqs.create_queue(QueueName="sume-fanout-gone")["QueueUrl"]  # type: ignore[attr-defined]
    sqs.delete_queue(QueueUrl=gone)  # type: ignore[attr-defined]
    settings: FanOutSettings = parts["settings"]  # type: ignore[assignment]
    report = FanOut(settings, store, PollQueue(gone, settings.common.clock, sqs=sqs), lease,
                    parts["budget"], lambda: 50_000).run()  # type: ignore[arg-type]
    assert (report.started, report.send_failed) == (0, 12), report.as_dict()
    assert not any(lease.held(ids))
    report = tick(parts).report  # the queue that exists: every chain starts now
    assert (report.started, report.send_failed) == (12, 0) and all(lease.held(ids))


def test_an_outbox_whose_publish_claim_is_held_is_left_to_its_holder(parts: dict[str, object]) -> None:
    """A terminal write that just won holds the publish claim (its record's chain_due_at, projected into
    the pending index): fan-out sends nothing for it until the claim expires, then the outbox message."""
    store: JobStore = parts["store"]  # type: ignore[assignment]
    now = Clock().now()
    for job_id, until in (("job_held", now + 60), ("job_expired", now - 1)):
        store.put_pending(job_id, "image", now=now, deadline_at=int(now) + 3_600)
        store.record_terminal(job_id, Ending("failed"), now=now, claim=PublishClaim("a" * 32, until))
    report = tick(parts).report
    assert (report.outbox_claimed, report.outbox_sent) == (1, 1)
    assert set(queued(parts)) == {"job_expired"}
