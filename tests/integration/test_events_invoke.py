"""Every file in events/ runs through the Docker-free `sam local invoke` stand-in, as a user runs
it (``python -m tools.local_invoke <Function> -e events/<file> --env-vars env.json
--parameter-overrides ...``): a fresh process per invocation, the function resolved from
template.yaml, against the real local services of the in-process stack (redis-server, moto
server, the Sume simulator). The stack provisions the template's table, queues and bucket and
resolves each function's environment; the env-vars file handed to local_invoke is that
environment, and the child process gets nothing else but dummy credentials and the moto endpoint.

Each test puts the system in the state its sample presumes (a pending record, the lease resting
at the sample's chain step, a job in the simulator), runs the files and checks what they did.
Independent invocations run concurrently (each is a cold Python process).

The jobs samples: ``http_post_job.json`` makes the jobs function invoke the submit function,
which moto cannot run: the child process's Lambda client is pointed at
``invoke_endpoint.InvokeEndpoint`` (``AWS_ENDPOINT_URL_LAMBDA``), which runs the stack's submit
handler in this process.

Webhook: the static webhook_delivery.json carries a signature whose timestamp is long outside
WebhookToleranceSeconds, so the test re-signs a copy with its own secret (stored as the SSM
parameter the function reads) and a fresh timestamp, as tests/unit/test_events_contract.py does.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from invoke_endpoint import InvokeEndpoint

from sume_poller.creates.createqueue import DrainMessage
from sume_poller.discovery.sweep import MIN_JOBS_PER_READ, STATUSES
from sume_poller.store.records import JobStore
from sume_poller.store.submissions import queue_item, queued_record
from tools.services import MotoServer
from tools.stack.base import CREDENTIALS, EmfTotals
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events"
#: Webhooks on (WebhookFunction exists) with no webhook kinds (submit passes no webhook_url, which
#: the simulator would refuse without webhook config). No read or create budget: samples run at
#: once, and the budget (its own tests cover it) would space their reads and creates apart.
PARAMETERS = {"Webhooks": "true", "WebhookKinds": "", "ReadsPerMinute": 0, "ReadsPerDay": 0,
              "CreatesPerMinute": 0, "CreatesPerDay": 0}
WEBHOOK_SECRET_NAME = "/sume-poller/webhook-secret"
WEBHOOK_SECRET = "whsec_it_" + uuid.uuid4().hex
LEASE_PREFIX = "sume:poll:"
INVOKE_TIMEOUT_S = 90
#: Which test runs each sample (a new events/*.json must be added here to pass).
INVOKED = {
    "submit_image.json": "test_submit_events_create_and_register_jobs",
    "submit_video.json": "test_submit_events_create_and_register_jobs",
    "submit_register.json": "test_submit_events_create_and_register_jobs",
    "poll_message.json": "test_poll_events_read_once_requeue_finish_and_report_poison",
    "poll_message_v1.json": "test_poll_events_read_once_requeue_finish_and_report_poison",
    "poll_malformed.json": "test_poll_events_read_once_requeue_finish_and_report_poison",
    "poll_result_phase.json": "test_poll_events_read_once_requeue_finish_and_report_poison",
    "poll_message_v3.json": "test_a_v3_step_whose_result_was_refused_reads_it_again_and_records_it",
    "sqs_create_drain.json": "test_a_drain_step_creates_the_queue_head_and_sends_the_next_step",
    "fanout_tick.json": "test_fanout_tick_restarts_due_chains_and_sweep_tick_hands_finished_jobs_over",
    "sweep_tick.json": "test_fanout_tick_restarts_due_chains_and_sweep_tick_hands_finished_jobs_over",
    "webhook_delivery.json": "test_a_re_signed_webhook_delivery_is_accepted_and_a_bad_signature_refused",
    "get_job.json": "test_jobs_events_read_a_recorded_job_and_post_a_submission",
    "http_get_job.json": "test_jobs_events_read_a_recorded_job_and_post_a_submission",
    "http_post_job.json": "test_jobs_events_read_a_recorded_job_and_post_a_submission",
}


@dataclass(frozen=True)
class Invocation:
    returncode: int
    reply: Any
    stderr: str

    def metrics(self) -> dict[str, int]:
        """Totals of the EMF metric lines the handler printed (they go to stderr)."""
        totals = EmfTotals()
        for line in self.stderr.splitlines():
            totals.add_line(line)
        return dict(totals.totals)


@pytest.fixture(scope="module")
def module_stack(moto_server: MotoServer) -> Iterator[InProcessStack]:
    with InProcessStack(time_scale=1.0, parameters=PARAMETERS, moto=moto_server) as stack:
        yield stack


@pytest.fixture
def stack(module_stack: InProcessStack) -> InProcessStack:
    module_stack.reset()
    return module_stack


@pytest.fixture
def rdb(stack: InProcessStack) -> Iterator[redis.Redis]:
    assert {spec.environment["LEASE_KEY_PREFIX"] for spec in stack.specs.values()} == {LEASE_PREFIX}
    client = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def invoke(stack: InProcessStack, tmp_path: Path) -> Callable[..., Invocation]:
    """``invoke(function, event, env=None)``: one `sam local invoke` of an events/ file (or a
    path); ``env`` adds variables to the child's environment."""
    # Each function's environment as the stack resolved it (resource names, local endpoints),
    # in SAM's env-vars format; the template parameters go in as --parameter-overrides.
    env_vars = tmp_path / "env.json"
    env_vars.write_text(json.dumps({lid: spec.environment for lid, spec in stack.specs.items()}))
    overrides = [f"{key}={value}" for key, value in stack.parameters.items()]
    child_env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG", "TMPDIR") if key in os.environ}
    child_env.update(CREDENTIALS, AWS_ENDPOINT_URL=stack.moto.endpoint_url)

    def run(function: str, event: str | Path, env: dict[str, str] | None = None) -> Invocation:
        path = event if isinstance(event, Path) else EVENTS / event
        command = [sys.executable, "-m", "tools.local_invoke", function, "-e", str(path),
                   "--env-vars", str(env_vars), "--parameter-overrides", *overrides]
        proc = subprocess.run(command, cwd=ROOT, env={**child_env, **(env or {})}, capture_output=True, text=True,
                              timeout=INVOKE_TIMEOUT_S, check=False)
        reply = json.loads(proc.stdout) if proc.stdout.strip() else None
        return Invocation(proc.returncode, reply, proc.stderr)

    return run


def concurrently(*calls: Callable[[], Invocation]) -> list[Invocation]:
    """Run independent invocations at once (each is its own process); results in order."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def event_body(name: str, index: int = 0) -> dict[str, Any]:
    """The decoded poll message of record ``index`` of an SQS sample."""
    body: dict[str, Any] = json.loads(json.loads((EVENTS / name).read_text())["Records"][index]["body"])
    return body


def put_pending(stack: InProcessStack, job_id: str, kind: str, *, chain_due_at: float | None = None) -> None:
    """A pending job record, as submit writes it (without the chain submit would start)."""
    store = JobStore(stack.outputs["JobsTableName"], int(stack.specs["PollFunction"].environment["PENDING_SHARDS"]))
    now = stack.clock.now()
    assert store.put_pending(job_id, kind, now=now - 60, deadline_at=int(now) + 86_400, chain_due_at=chain_due_at)


def lease(rdb: redis.Redis, job_id: str) -> str | None:
    value: str | None = rdb.get(LEASE_PREFIX + job_id)
    return value


def ok(result: Invocation) -> Any:
    assert result.returncode == 0, result.stderr[-3000:]
    return result.reply


# ------------------------------------------------------------------------------------------------ tests


def test_every_event_file_is_invoked() -> None:
    assert sorted(p.name for p in EVENTS.glob("*.json")) == sorted(INVOKED)
    assert set(INVOKED.values()) <= set(globals()), "each sample is run by a test of this module"


def test_submit_events_create_and_register_jobs(stack: InProcessStack, invoke: Any, rdb: redis.Redis) -> None:
    registered = json.loads((EVENTS / "submit_register.json").read_text())["job_id"]
    stack.sim.seed_job("video", {"duration": 600}, job_id=registered)  # started elsewhere: no create here

    image, video, register = concurrently(lambda: invoke("SubmitFunction", "submit_image.json"),
                                          lambda: invoke("SubmitFunction", "submit_video.json"),
                                          lambda: invoke("SubmitFunction", "submit_register.json"))

    replies = {"image": ok(image), "video": ok(video)}
    for kind, reply in replies.items():
        assert reply["status"] == "submitted" and reply["replayed"] is False, reply
        assert reply["idempotency_key"] == f"example-{kind}-0001" and reply["derived_key"] is False
        assert len(reply["job_ids"]) == 1 and reply["new"] == reply["job_ids"]
    assert stack.sim.stats()["creates"] == 2  # one paid create per create sample, none for the register
    assert ok(register) == {"status": "registered", "job_ids": [registered], "new": [registered], "replayed": False,
                            "key": "default"}

    records = {r["job_id"]: r for r in stack.records()}
    image_id, video_id = replies["image"]["job_ids"][0], replies["video"]["job_ids"][0]
    assert set(records) == {image_id, video_id, registered}
    assert {j: (r["status"], r["kind"], r["profile"]) for j, r in records.items()} == {
        image_id: ("pending", "image", "image|mp1"), video_id: ("pending", "video", "video|d8|mp1"),
        registered: ("pending", "video", "video")}
    assert records[image_id]["idempotency_key"] == "example-image-0001"
    # Each started its job's chain: the lease rests at step 0 and the first poll is queued.
    leases = {j: lease(rdb, j) for j in records}
    assert all(re.fullmatch(r"[0-9a-f]{32}:0", value or "") for value in leases.values()), leases
    assert stack.queue_depth() == 3


def test_poll_events_read_once_requeue_finish_and_report_poison(stack: InProcessStack, invoke: Any,
                                                                 rdb: redis.Redis) -> None:
    v2, v1 = event_body("poll_message.json"), event_body("poll_message_v1.json")
    poison_ok, result = event_body("poll_malformed.json", 1), event_body("poll_result_phase.json")
    assert len({v2["job_id"], v1["job_id"], poison_ok["job_id"], result["job_id"]}) == 4  # they can run at once
    for body in (v2, v1, poison_ok):  # running jobs, recorded pending
        stack.sim.seed_job(body["kind"], {"duration": 100_000}, job_id=body["job_id"])
        put_pending(stack, body["job_id"], body["kind"])
    stack.sim.seed_job(result["kind"], {"duration": 0}, job_id=result["job_id"])  # completed, result ready
    put_pending(stack, result["job_id"], result["kind"])
    # What submit left for the v2 sample (step 0 of its chain, resting) and what a sweep left for the
    # result-phase sample (it handed the chain over to step 1). The v1 sample has no token: its
    # claim starts a fresh chain, as does the good record next to the poison one (its lease is free).
    rdb.set(LEASE_PREFIX + v2["job_id"], f"{v2['token']}:0", px=600_000)
    rdb.set(LEASE_PREFIX + result["job_id"], f"{result['token']}:{result['seq']}*", px=600_000)

    current, old, malformed, finishing = concurrently(
        lambda: invoke("PollFunction", "poll_message.json"), lambda: invoke("PollFunction", "poll_message_v1.json"),
        lambda: invoke("PollFunction", "poll_malformed.json"), lambda: invoke("PollFunction", "poll_result_phase.json"))

    jobs = stack.sim.stats()["jobs"]
    reads = {body["job_id"]: (jobs[body["job_id"]]["status_reads"], jobs[body["job_id"]]["result_reads"])
             for body in (v2, v1, poison_ok, result)}
    assert reads == {v2["job_id"]: (1, 0), v1["job_id"]: (1, 0), poison_ok["job_id"]: (1, 0),
                     result["job_id"]: (0, 1)}

    # v2: its own chain's step 0, read once and re-queued as step 1 of the same chain.
    assert ok(current) == {"batchItemFailures": []}
    assert current.metrics().get("Outcome_requeued") == 1
    assert lease(rdb, v2["job_id"]) == f"{v2['token']}:1"
    # v1 (left in the queue by the previous version): read once, re-queued as a new v2 chain.
    assert ok(old) == {"batchItemFailures": []}
    assert old.metrics().get("Outcome_requeued") == 1
    assert re.fullmatch(r"[0-9a-f]{32}:1", lease(rdb, v1["job_id"]) or "")
    # The poison record fails alone (SQS redelivers it, then the DLQ); its neighbour is processed.
    poison_id = json.loads((EVENTS / "poll_malformed.json").read_text())["Records"][0]["messageId"]
    assert ok(malformed) == {"batchItemFailures": [{"itemIdentifier": poison_id}]}
    assert "malformed poll message" in malformed.stderr
    assert malformed.metrics().get("Outcome_malformed") == 1 and malformed.metrics().get("Outcome_requeued") == 1
    # The finishing step fetched the result once, recorded the job and published its event.
    assert ok(finishing) == {"batchItemFailures": []}
    record = stack.record(result["job_id"])
    assert record is not None and (record["status"], record["found_by"], record["status_reads"],
                                   record["result_reads"]) == ("completed", "sweep", 1, 1), record
    assert lease(rdb, result["job_id"]) is None
    assert [e["job_id"] for e in stack.sink.drain(wait_seconds=5)] == [result["job_id"]]
    assert stack.queue_depth() == 3  # the three re-queued steps
    assert all(stack.record(b["job_id"])["status"] == "pending" for b in (v2, v1, poison_ok))  # type: ignore[index]


def test_a_v3_step_whose_result_was_refused_reads_it_again_and_records_it(stack: InProcessStack, invoke: Any,
                                                                        rdb: redis.Redis) -> None:
    """A v3 message (``refused_since``: its result route had refused the result): the step reads the
    result again; Sume serves it now: recorded completed with it, on the result read's word."""
    body = event_body("poll_message_v3.json")
    assert body["v"] == 3 and body["refused_since"]
    stack.sim.seed_job(body["kind"], {"duration": 0}, job_id=body["job_id"])  # completed, result ready
    put_pending(stack, body["job_id"], body["kind"])
    rdb.set(LEASE_PREFIX + body["job_id"], f"{body['token']}:{body['seq']}*", px=600_000)  # a finishing step
    result = invoke("PollFunction", "poll_message_v3.json")
    assert ok(result) == {"batchItemFailures": []} and result.metrics().get("Outcome_terminal") == 1
    record = stack.record(body["job_id"])
    assert record is not None and (record["status"], record["evidence"]) == ("completed", "result_read"), record
    assert record["result_json"] and record["result_reads"] == body["result_reads"] + 1
    assert stack.sim.stats()["jobs"][body["job_id"]]["result_reads"] == 1
    assert [e["job_id"] for e in stack.sink.drain(wait_seconds=5)] == [body["job_id"]]


def test_a_drain_step_creates_the_queue_head_and_sends_the_next_step(stack: InProcessStack, invoke: Any,
                                                                    rdb: redis.Redis) -> None:
    # A submission queued on the default key (as submit queues one), its drain's message lost.
    store = JobStore(stack.outputs["JobsTableName"], 1)
    now = stack.clock.now()
    item = queue_item("default", kind="image", params={"prompt": "queued", "sim": {"duration": 600}},
                      idempotency_key="example-queued-0001", derived=False, arrived=now - 5, deadline_at=now + 3600)
    assert store.enqueue(item, queued_record(item))
    assert event_drain().key is None  # the sample is the default key's: it names none

    result = invoke("SubmitFunction", "sqs_create_drain.json")

    assert ok(result) == {"batchItemFailures": []}
    record = store.submission("default", "example-queued-0001")
    assert record is not None and record["status"] == "created" and len(record["job_ids"]) == 1
    (job_id,) = record["job_ids"]
    assert stack.record(job_id)["status"] == "pending"  # type: ignore[index]
    assert stack.sim.stats()["creates"] == 1 and store.get(item["job_id"]) is None  # created once, dequeued
    assert re.fullmatch(r"[0-9a-f]{32}:0", lease(rdb, job_id) or "") and stack.queue_depth() == 1  # its chain
    # The lease was free (the sample's chain is long gone): the step ran as a fresh drain and rests on step 1.
    assert re.fullmatch(r"[0-9a-f]{32}:1", lease(rdb, "!drain:default") or "")
    sqs = stack.client("sqs")
    (next_step,) = sqs.receive_message(QueueUrl=stack.outputs["CreateQueueUrl"], WaitTimeSeconds=1)["Messages"]
    message = DrainMessage.parse(next_step["Body"])
    assert (message.token, message.seq, message.key) == (lease(rdb, "!drain:default")[:32], 1, None)  # type: ignore[index]
    assert result.metrics().get("SubmissionsCreatedFromQueue") == 1


def event_drain() -> DrainMessage:
    return DrainMessage.parse(json.loads((EVENTS / "sqs_create_drain.json").read_text())["Records"][0]["body"])


def test_fanout_tick_restarts_due_chains_and_sweep_tick_hands_finished_jobs_over(
        stack: InProcessStack, invoke: Any, rdb: redis.Redis) -> None:
    # Enough pending jobs that a sweep saves reads (MIN_JOBS_PER_READ per list read), every one
    # finished at Sume and without a chain (its record says it was due: the chain died).
    count = MIN_JOBS_PER_READ * len(STATUSES) + 4
    ids = [f"job_5eed{i:012x}" for i in range(count)]
    for job_id in ids:
        stack.sim.seed_job("image", {"duration": 0}, job_id=job_id)
        put_pending(stack, job_id, "image", chain_due_at=stack.clock.now() - 1)

    fanout = ok(invoke("FanOutFunction", "fanout_tick.json"))

    assert (fanout["pending_counted"], fanout["started"], fanout["redis_unavailable"]) == (count, count, False), fanout
    assert fanout["allowance"] == "unlimited"
    tokens = {j: lease(rdb, j) for j in ids}
    assert all(re.fullmatch(r"[0-9a-f]{32}:0", v or "") for v in tokens.values()), tokens
    assert stack.queue_depth() == count

    sweep = ok(invoke("SweepFunction", "sweep_tick.json"))

    assert sweep["ran"] is True and sweep["complete"] is True, sweep
    assert (sweep["reads"], sweep["ours"], sweep["handed_over"], sweep["left_to_chain"]) == \
        (len(STATUSES), count, count, 0), sweep
    assert {j: lease(rdb, j) for j in ids} == {j: f"{t.split(':')[0]}:1*" for j, t in tokens.items() if t}
    assert stack.queue_depth() == 2 * count  # a finishing step per job, next to the chains' fenced-out steps
    assert stack.sim.stats()["status_reads"] == 0  # nothing was read job by job


def test_a_re_signed_webhook_delivery_is_accepted_and_a_bad_signature_refused(
        stack: InProcessStack, invoke: Any, rdb: redis.Redis, tmp_path: Path) -> None:
    stack.client("ssm").put_parameter(Name=WEBHOOK_SECRET_NAME, Value=WEBHOOK_SECRET, Type="SecureString",
                                      Overwrite=True)
    delivery = json.loads((EVENTS / "webhook_delivery.json").read_text())
    job_id = json.loads(delivery["body"])["data"]["job_id"]
    stack.sim.seed_job("video", {"duration": 600}, job_id=job_id)
    assert stack.submit({"kind": "video", "job_id": job_id})["status"] == "registered"  # its chain waits at T:0
    (token, _) = (lease(rdb, job_id) or "").split(":")

    def signed(name: str, secret: str) -> Path:
        """The sample re-signed now (X-Sume-Signature = "v1=" + hex HMAC-SHA256 of "{timestamp}.{body}")."""
        fresh = copy.deepcopy(delivery)
        stamp = str(int(time.time()))  # TimeScale 1: the function's clock is the wall clock
        digest = hmac.new(secret.encode(), f"{stamp}.{fresh['body']}".encode(), hashlib.sha256).hexdigest()
        fresh["headers"].update({"x-sume-timestamp": stamp, "x-sume-signature": f"v1={digest}"})
        path = tmp_path / name
        path.write_text(json.dumps(fresh))
        return path

    good, bad = signed("webhook_resigned.json", WEBHOOK_SECRET), signed("webhook_bad.json", "whsec_someone_else")
    accepted, refused = concurrently(lambda: invoke("WebhookFunction", good), lambda: invoke("WebhookFunction", bad))

    assert ok(refused)["statusCode"] == 401 and json.loads(refused.reply["body"]) == {"error": "bad signature"}
    assert ok(accepted)["statusCode"] == 202, accepted.reply
    assert json.loads(accepted.reply["body"]) == {"job_id": job_id, "queued": True}
    assert accepted.metrics().get("Webhook_202") == 1 and refused.metrics().get("Webhook_401") == 1
    assert lease(rdb, job_id) == f"{token}:1*"  # the chain's waiting step is handed to a read due now
    assert stack.queue_depth() == 2  # submit's first step and the webhook's read
    # The event id is remembered in Redis: Sume's retry of the same delivery is a duplicate.
    again = stack.invoke("WebhookFunction", json.loads(good.read_text()))
    assert (again["statusCode"], json.loads(again["body"])) == (200, {"duplicate": True})


def test_jobs_events_read_a_recorded_job_and_post_a_submission(stack: InProcessStack, invoke: Any) -> None:
    job_id = json.loads((EVENTS / "get_job.json").read_text())["job_id"]
    assert json.loads((EVENTS / "http_get_job.json").read_text())["rawPath"] == f"/jobs/{job_id}"
    put_pending(stack, job_id, "image")
    submission = json.loads(json.loads((EVENTS / "http_post_job.json").read_text())["body"])

    with InvokeEndpoint(stack) as endpoint:
        lam = {"AWS_ENDPOINT_URL_LAMBDA": endpoint.url}
        direct, over_http, posted = concurrently(lambda: invoke("JobsFunction", "get_job.json"),
                                                 lambda: invoke("JobsFunction", "http_get_job.json"),
                                                 lambda: invoke("JobsFunction", "http_post_job.json", lam))

    reply = ok(direct)
    assert (reply["job_id"], reply["kind"], reply["status"], reply["result_location"]) == (
        job_id, "image", "pending", None)
    assert ok(over_http)["statusCode"] == 200 and json.loads(over_http.reply["body"]) == reply
    assert ok(posted)["statusCode"] == 202, posted.reply
    body = json.loads(posted.reply["body"])
    assert (body["status"], body["idempotency_key"], body["replayed"]) == (
        "submitted", submission["idempotency_key"], False)
    assert endpoint.invoked == [("SubmitFunction", submission)]  # the request's body, as the submit event
    (new,) = body["job_ids"]
    assert posted.reply["headers"]["Location"] == f"/jobs/{new}"
    assert stack.record(new)["status"] == "pending" and stack.sim.stats()["creates"] == 1  # type: ignore[index]
    assert (direct.metrics().get("Jobs_200"), over_http.metrics().get("Jobs_200"), posted.metrics().get("Jobs_202")) \
        == (1, 1, 1)
