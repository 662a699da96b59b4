"""Large results through the real poll path (the Sume simulator in a process of its own, moto server,
redis-server): a 30 MB result among nine small ones in one batch is streamed to S3 - the bytes as
Sume sent them, content type kept - while this process's memory stays far below the result's size;
a result over the maximum is recorded completed with ``result_too_large`` and its size, once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import redis

from sume_poller import runtime
from sume_poller.core.aws import client
from sume_poller.core.messages import PollMessage
from sume_poller.limits.lease import new_token
from sume_poller.poll.poller import PollSettings
from sume_poller.store.records import UPLOAD_PART_BYTES, UPLOAD_STREAMS
from tools.template import Provisioned

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
KEY = "sume_large_results_key"
LARGE = 30_000_000


@pytest.fixture
def sim() -> Iterator[str]:
    """The simulator in its own process: the 30 MB body it builds is not this process's memory."""
    process = subprocess.Popen([sys.executable, "-m", "tools.sume_sim", "--port", "0", "--api-key", KEY],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True,
                               env={"PYTHONPATH": f"{ROOT}:{ROOT / 'layers/sume_poller'}", "PATH": "/usr/bin:/bin"})
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        yield line.rsplit(" ", 1)[1].strip()
    finally:
        process.terminate()
        process.wait(timeout=10)


def seed(sim_url: str, sim: dict[str, object]) -> str:
    """A job the simulator created an hour ago (so it is finished): its id."""
    base = sim_url.rsplit("/api/v1", 1)[0]
    body = json.dumps({"kind": "video", "sim": sim, "age": 3_600}).encode()
    request = urllib.request.Request(f"{base}/_sim/jobs", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return str(json.loads(reply.read())["id"])


@pytest.fixture
def poll_env(template_resources: Provisioned, rdb: redis.Redis, sim: str, aws: str,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    port = rdb.connection_pool.connection_kwargs["port"]
    boto3.client("ssm").put_parameter(Name="/sume/key", Value=KEY, Type="SecureString")
    env = {"JOBS_TABLE": "jobs", "POLL_QUEUE_URL": template_resources["PollQueue"], "RESULT_BUCKET": "results",
           "SUME_BASE_URL": sim, "SUME_API_KEY_NAME": "/sume/key", "REDIS_URL": f"redis://127.0.0.1:{port}/0",
           "LOCAL_ENDPOINTS": "true", "READS_PER_MINUTE": "0", "READS_PER_DAY": "0", "SWEEPS": "false",
           "RESULT_MAX_MEGABYTES": "40", "PENDING_SHARDS": "4"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    runtime.reset()
    yield env
    runtime.reset()


def batch(job_ids: list[str]) -> dict[str, object]:
    """An SQS event of each job's first chain step, due now; the jobs recorded and leased as submit does."""
    from sume_poller.store.records import JobStore

    store, records = JobStore("jobs", 4), []
    lease = runtime.redis_client(PollSettings.from_env(os.environ).redis)
    for n, job_id in enumerate(job_ids):
        store.put_pending(job_id, "video", now=1.0, deadline_at=4_102_444_800)
        token = new_token()
        lease.set(f"sume:poll:{job_id}", f"{token}:0", px=60_000)
        body = PollMessage(job_id=job_id, kind="video", deadline_at=4_102_444_800, due_at=0.0, token=token,
                           submitted_at=1).to_json()
        records.append({"messageId": f"m{n}", "receiptHandle": f"r{n}", "body": body, "attributes": {},
                        "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
                        "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:poll", "awsRegion": "us-east-1"})
    return {"Records": records}


def test_a_30_mb_result_among_nine_small_ones_is_streamed_to_s3_in_bounded_memory(
        poll_env: dict[str, str], sim: str) -> None:
    large = seed(sim, {"duration": 1, "result_shape": "large", "result_bytes": LARGE})
    small = [seed(sim, {"duration": 1}) for _ in range(9)]
    event = batch([large, *small])
    runner = runtime.poll_runner()
    for service in ("s3", "events", "dynamodb", "sqs"):  # a warm container: its clients are built
        client(service)
    tracemalloc.start()
    try:
        report = runner.run(event, lambda: 25_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [o.name for o in report.outcomes] == ["terminal"] * 10, report.outcomes
    bound = (UPLOAD_STREAMS + 1) * UPLOAD_PART_BYTES  # a part per upload, and the one being read
    assert peak < bound < LARGE, f"peak {peak / 1e6:.1f} MB"
    from sume_poller.store.records import JobStore

    record = JobStore("jobs", 4).get(large)
    assert record is not None and "result_json" not in record
    s3 = boto3.client("s3")
    head = s3.head_object(Bucket="results", Key=record["result_s3_key"])
    assert head["ContentLength"] == record["result_bytes"] > LARGE and head["ContentType"] == "application/json"
    assert record["result_content_type"] == "application/json"
    assert s3.get_object_tagging(Bucket="results", Key=record["result_s3_key"])["TagSet"] == []  # claimed
    body = s3.get_object(Bucket="results", Key=record["result_s3_key"])["Body"].read()
    assert json.loads(body)["job_id"] == large  # the bytes as Sume sent them
    assert all(json.loads(JobStore("jobs", 4).get(j)["result_json"]) for j in small)  # type: ignore[index]


def test_a_result_over_the_maximum_is_recorded_completed_with_its_size_and_never_stored(
        poll_env: dict[str, str], sim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESULT_MAX_MEGABYTES", "1")
    runtime.reset()
    job = seed(sim, {"duration": 1, "result_shape": "large", "result_bytes": 3_000_000})
    report = runtime.poll_runner().run(batch([job]), lambda: 25_000)
    assert [o.status for o in report.outcomes] == ["completed"]
    from sume_poller.store.records import JobStore

    record = JobStore("jobs", 4).get(job)
    assert record is not None and record["error"]["code"] == "result_too_large"
    assert record["result_bytes"] > 1_000_000 and "result_s3_key" not in record and "result_json" not in record
    assert boto3.client("s3").list_objects_v2(Bucket="results").get("KeyCount", 0) == 0
