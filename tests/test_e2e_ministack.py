"""End to end: template.yaml built with `sam build`, deployed with `sam deploy` into ministack (no
Docker), with real redis-server and the Sume simulator. The deployed SQS event source mapping runs
the poll function and the deployed schedule runs fan-out; where a test cannot wait for the next
scheduled tick (at most once a minute) it invokes the deployed FanOutFunction itself.

Invariants checked after every test, over every job the module created:
* every job is recorded terminal exactly once (one record, status terminal, no pending_shard);
* exactly one terminal event per job id reached the default bus (EventBridge rule -> SQS sink);
* the poll queue is drained and the dead-letter queue is empty;
* Sume status reads per job stay within the stated bound of the simulator's ``min_reads``.

Synchronisation is by polling conditions with deadlines only.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from sume_poller.aws import JobStore
from sume_poller.messages import PollMessage
from tools.ministack import DeployedStack, EmfTotals, EventSink, MinistackServer, build, deploy, ensure_venvs
from tools.services import RedisServer
from tools.sume_sim import SumeSimulator

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

API_KEY = "sume_e2e_" + uuid.uuid4().hex
LEASE_PREFIX = "sume:poll:"
TERMINAL = {"completed", "failed", "canceled", "expired", "timed_out"}
#: Template parameters for the test stack (the rest keep the template's defaults). ClaimTtlSeconds
#: stays above the poll function's 30 s timeout, as the template asks.
OVERRIDES = {"LeaseMarginSeconds": 5, "ClaimTtlSeconds": 35, "PollMaxConcurrency": 5, "PollBatchSize": 10}


def wait_for(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.25) -> Any:
    """Poll ``condition`` until it returns something truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


@dataclass
class E2E:
    stack: DeployedStack
    sink: EventSink
    metrics: EmfTotals
    sim: SumeSimulator
    redis: redis.Redis
    #: job id -> expected terminal status, for every job this module created
    expected: dict[str, str] = field(default_factory=dict)
    #: job id -> extra Sume status reads allowed above the simulator's min_reads
    slack: dict[str, int] = field(default_factory=dict)

    def submit(self, kind: str, sim: dict[str, Any], expect: str, slack: int = 0) -> list[str]:
        reply = self.stack.submit({"kind": kind, "params": {"prompt": uuid.uuid4().hex, "sim": sim}})
        assert reply["status"] == "submitted", reply
        for job_id in reply["job_ids"]:
            self.expected[job_id] = expect
            self.slack[job_id] = slack
        return list(reply["job_ids"])

    def terminal(self, job_ids: list[str]) -> bool:
        records = {r["job_id"]: r for r in self.stack.scan(("job_id", "status"))}
        return all(records.get(j, {}).get("status") in TERMINAL for j in job_ids)

    def events_for(self, job_ids: list[str]) -> bool:
        self.sink.drain(wait_seconds=1)
        seen = {e["job_id"] for e in self.sink.received}
        return all(j in seen for j in job_ids)

    def quiet(self) -> bool:
        """Nothing queued or in flight (the ESM deletes a message only after the function returned,
        so an empty queue means every terminal event of a finished poll is on the bus)."""
        return self.stack.queue_depth() == 0

    def check_invariants(self) -> None:
        wait_for(self.quiet, 60, "the poll queue to drain")
        self.sink.drain(wait_seconds=1)
        items = self.stack.scan(("job_id", "status", "pending_shard", "event_pending"))
        by_id = Counter(i["job_id"] for i in items)
        records = {i["job_id"]: i for i in items}
        for job_id, status in self.expected.items():
            assert by_id[job_id] == 1, f"{job_id} recorded {by_id[job_id]} times"
            record = records[job_id]
            assert record["status"] == status, record
            assert "pending_shard" not in record and "event_pending" not in record, record
        per_job = Counter(e["job_id"] for e in self.sink.received)
        assert {j: n for j, n in per_job.items() if n != 1} == {}, "terminal events not exactly one per job"
        assert set(per_job) == set(self.expected), (set(per_job) ^ set(self.expected))
        for event in self.sink.received:
            assert event["status"] == self.expected[event["job_id"]], event
        assert self.stack.dlq_depth() == 0
        jobs = self.sim.stats()["jobs"]
        over = {j: (s["status_reads"], s["min_reads"], self.slack[j]) for j, s in jobs.items()
                if j in self.slack and s["status_reads"] > s["min_reads"] + self.slack[j]}
        assert over == {}, f"status reads above min_reads + slack: {over}"


@pytest.fixture(scope="module")
def e2e() -> Iterator[E2E]:
    ensure_venvs()  # raises with pip's output if a virtualenv cannot be created: never skips
    with ExitStack() as stack:
        redis_server = stack.enter_context(RedisServer())
        sim = stack.enter_context(SumeSimulator(api_key=API_KEY, hints=True, time_scale=1.0))
        ministack = stack.enter_context(MinistackServer())
        deployed = deploy(ministack.endpoint_url, template=build(), sume_base_url=sim.base_url,
                          redis_url=redis_server.url, api_key=API_KEY, stack_name="sume-poller-e2e",
                          overrides=OVERRIDES)
        sink = deployed.event_sink()
        client = redis.Redis.from_url(redis_server.url, decode_responses=True)
        stack.callback(client.close)
        yield E2E(deployed, sink, deployed.metric_totals(), sim, client)


def test_deployed_stack_is_wired_as_the_template_says(e2e: E2E) -> None:
    stack = e2e.stack
    config = stack.lam.get_function_configuration(FunctionName=stack.poll_function)
    assert config["Runtime"] == "python3.11" and config["Architectures"] == ["arm64"]
    env = config["Environment"]["Variables"]
    assert env["SUME_API_KEY_NAME"] == "/sume-poller/api-key" and env["LEASE_MARGIN_SECONDS"] == "5"
    [mapping] = stack.lam.list_event_source_mappings(FunctionName=stack.poll_function)["EventSourceMappings"]
    assert mapping["BatchSize"] == 10 and mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["ScalingConfig"] == {"MaximumConcurrency": 5}
    concurrency = stack.lam.get_function_concurrency(FunctionName=stack.fanout_function)
    assert concurrency["ReservedConcurrentExecutions"] == 1
    rules = stack.events.list_rule_names_by_target(
        TargetArn=stack.lam.get_function(FunctionName=stack.fanout_function)["Configuration"]["FunctionArn"])
    [rule] = rules["RuleNames"]
    assert stack.events.describe_rule(Name=rule)["ScheduleExpression"] == "rate(1 minute)"
    parameter = stack.client("ssm").get_parameter(Name="/sume-poller/api-key", WithDecryption=True)["Parameter"]
    assert parameter["Type"] == "SecureString" and parameter["Value"] == API_KEY


def test_jobs_reach_every_terminal_status_exactly_once(e2e: E2E) -> None:
    started = time.monotonic()
    # A job recorded long ago whose deadline has passed (written as submit writes it, without its
    # first poll): the deployed fan-out sends it and the poll function records timed_out without
    # reading Sume.
    stale = "job_stale" + uuid.uuid4().hex[:12]
    assert JobStore(e2e.stack.table, e2e.stack.ddb).put_pending(stale, "image", int(time.time()) - 1, 8)
    e2e.expected[stale] = "timed_out"
    e2e.slack[stale] = 0
    report = e2e.stack.fanout()
    assert report["pending_seen"] >= 1 and report["sent"] + report["leased"] >= 1, report
    assert not report["redis_unavailable"] and not report["auth_paused"], report
    ids: list[str] = [stale]
    kinds = ["image", "reference_analysis", "face_swap", "image", "video", "ad_video"]
    outcomes = {"completed": "completed", "succeeded": "completed", "failed": "failed",
                "canceled": "canceled", "cancelled": "canceled", "expired": "expired", "error": "failed"}
    for i, (outcome, expect) in enumerate(outcomes.items()):
        for j, kind in enumerate(kinds[i % 2::2]):  # 3 kinds per outcome, alternating sets
            duration = 2.0 + (i + j) % 3 if kind not in ("video", "ad_video") else 4.0
            ids += e2e.submit(kind, {"outcome": outcome, "duration": duration, "steps": 1 + (i + j) % 3}, expect)
    # Transient Sume faults, a result that is not ready at once, and a job without server hints.
    ids += e2e.submit("image", {"duration": 2, "faults": ["429:1"]}, "completed", slack=1)
    ids += e2e.submit("image", {"duration": 2, "faults": ["503:1", "500"]}, "completed", slack=2)
    ids += e2e.submit("image", {"duration": 2, "faults": ["malformed"], "outcome": "failed"}, "failed", slack=1)
    ids += e2e.submit("image", {"duration": 2, "result_delay": 2}, "completed", slack=1)
    ids += e2e.submit("image", {"duration": 4, "steps": 2, "hints": False}, "completed", slack=2)
    assert len(ids) >= 30
    wait_for(lambda: e2e.terminal(ids), 120, f"{len(ids)} jobs to be terminal")
    wait_for(lambda: e2e.events_for(ids), 30, "one terminal event per job")
    records = {r["job_id"]: r for r in e2e.stack.scan(("job_id", "status"))}
    assert Counter(records[j]["status"] for j in ids) == Counter(e2e.expected[j] for j in ids)
    assert {records[j]["status"] for j in ids} == TERMINAL
    assert e2e.sim.job_info(stale) is None  # never read from Sume
    e2e.check_invariants()
    stats = e2e.sim.stats()["jobs"]
    reads = sum(stats[j]["status_reads"] for j in ids if j in stats)
    minimum = sum(stats[j]["min_reads"] for j in ids if j in stats)
    print(f"\n{len(ids)} jobs terminal in {time.monotonic() - started:.1f} s; "
          f"Sume status reads {reads} / min_reads {minimum}")


def _lease(e2e: E2E, job_id: str) -> tuple[str, int] | None:
    value = e2e.redis.get(LEASE_PREFIX + job_id)
    if not value:
        return None
    token, seq = str(value).rsplit(":", 1)
    return token, int(seq)


def test_duplicate_delivery_is_absorbed(e2e: E2E) -> None:
    totals = e2e.metrics.refresh()
    before = {name: totals[name] for name in ("LeaseContention", "Outcome_duplicate")}
    # A live chain: two copies of its in-flight message are delivered (an early duplicate).
    [live] = e2e.submit("image", {"duration": 10, "steps": 5}, "completed", slack=1)
    token, seq = wait_for(lambda: (lease := _lease(e2e, live)) and lease[1] >= 1 and lease, 30,
                          "the live job's chain to take its lease")
    record = e2e.stack.job(live)
    assert record is not None
    copy = PollMessage(job_id=live, kind="image", deadline_at=int(record["deadline_at"]), due_at=time.time(),
                       token=token, seq=seq, attempt=1).to_json()
    e2e.stack.send(copy)
    e2e.stack.send(copy)
    # A finished job: a fan-out style copy (no token) and a stale chain copy both arrive late.
    [done] = e2e.submit("image", {"duration": 1, "steps": 1}, "completed")
    wait_for(lambda: e2e.terminal([done]), 60, "the second job to be terminal")
    reads_done = e2e.sim.job_info(done)["status_reads"]  # type: ignore[index]
    record = e2e.stack.job(done)
    assert record is not None
    late = PollMessage(job_id=done, kind="image", deadline_at=int(record["deadline_at"]), due_at=time.time())
    e2e.stack.send(late.to_json())
    e2e.stack.send(late.next(token=uuid.uuid4().hex, seq=3, attempt=2).to_json())

    wait_for(lambda: e2e.terminal([live, done]), 90, "both jobs to be terminal")
    wait_for(lambda: e2e.events_for([live, done]), 30, "their terminal events")
    wait_for(e2e.quiet, 60, "every copy to be consumed")

    def absorbed() -> bool:
        totals = e2e.metrics.refresh()
        dropped = (totals["LeaseContention"] - before["LeaseContention"]
                   + totals["Outcome_duplicate"] - before["Outcome_duplicate"])
        return dropped >= 3  # the losing live copy (or the original) and both late copies
    wait_for(absorbed, 30, "the poll function's metrics to show the copies dropped")
    totals = e2e.metrics.refresh()
    print(f"\ncopies dropped: contention +{totals['LeaseContention'] - before['LeaseContention']}, "
          f"duplicate +{totals['Outcome_duplicate'] - before['Outcome_duplicate']}; live job reads "
          f"{e2e.sim.job_info(live)['status_reads']} / min {e2e.sim.job_info(live)['min_reads']}")  # type: ignore[index]
    assert e2e.sim.job_info(done)["status_reads"] == reads_done  # type: ignore[index]
    e2e.check_invariants()


def test_crashed_poller_lease_expires_then_fanout_recovers(e2e: E2E) -> None:
    job_id = "job_crash" + uuid.uuid4().hex[:12]
    e2e.sim.seed_job("image", {"duration": 1, "steps": 1}, job_id=job_id)
    # A poller died holding the job's lease; its message is gone. The lease outlives our checks.
    ttl_ms = 12_000
    assert e2e.redis.set(LEASE_PREFIX + job_id, f"{uuid.uuid4().hex}:4", nx=True, px=ttl_ms)
    leased_until = time.monotonic() + ttl_ms / 1000
    reply = e2e.stack.submit({"kind": "image", "job_id": job_id})  # register: queues a first poll
    assert reply["status"] == "registered" and reply["new"] == [job_id], reply
    e2e.expected[job_id] = "completed"
    e2e.slack[job_id] = 0

    contention = e2e.metrics.refresh()["LeaseContention"]
    wait_for(lambda: e2e.quiet() and e2e.metrics.refresh()["LeaseContention"] > contention, 30,
             "the first poll to find the dead poller's lease and drop")
    report = e2e.stack.fanout()
    assert time.monotonic() < leased_until, "the lease expired before fan-out ran; raise ttl_ms"
    assert report["leased"] >= 1 and report["sent"] == 0, report
    assert e2e.sim.job_info(job_id)["status_reads"] == 0  # type: ignore[index]
    assert e2e.stack.job(job_id)["status"] == "pending"  # type: ignore[index]

    wait_for(lambda: not e2e.redis.exists(LEASE_PREFIX + job_id), ttl_ms / 1000 + 10, "the lease to expire")
    report = e2e.stack.fanout()
    assert report["sent"] >= 1 or e2e.terminal([job_id]), report  # (or the schedule got there first)
    wait_for(lambda: e2e.terminal([job_id]), 60, "the recovered job to be terminal")
    wait_for(lambda: e2e.events_for([job_id]), 30, "its terminal event")
    e2e.check_invariants()
    print(json.dumps({"crash_recovery_report": report}))
