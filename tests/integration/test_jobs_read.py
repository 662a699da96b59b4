"""The jobs function on the in-process stack (moto server, redis-server, the Sume simulator): jobs
the real poll path finished, read back in one call - an inline result, and a large one whose
pre-signed URL, fetched with urllib3, gives the object's bytes; an unknown job; POST /jobs through
to the real submit handler.

POST /jobs invokes the submit function with boto3's Lambda client, which moto cannot run without
Docker: :class:`invoke_endpoint.InvokeEndpoint` stands in for Lambda's Invoke API
(``AWS_ENDPOINT_URL_LAMBDA``) and runs the stack's own submit handler. So the jobs function's real
client, request and reply parsing run; what Lambda itself adds is e2e's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import urllib3
from invoke_endpoint import InvokeEndpoint

from sume_poller.store.records import INLINE_RESULT_BYTES
from tools.services import MotoServer
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

#: No read or create budget: reads and creates happen at once (the budget has its own tests).
PARAMETERS = {"ReadsPerMinute": 0, "ReadsPerDay": 0, "CreatesPerMinute": 0, "CreatesPerDay": 0,
              "ResultUrlExpirySeconds": 120, "Sweeps": "false"}
PUBLIC = {"job_id", "key", "idempotency_key", "kind", "status", "sume_status", "error", "submitted_at", "updated_at",
          "terminal_at", "deadline_at", "found_by", "reads", "result_location", "result", "result_url",
          "result_url_expires_at", "result_bytes", "result_content_type"}


@pytest.fixture(scope="module")
def module_stack(moto_server: MotoServer) -> Iterator[InProcessStack]:
    with InProcessStack(time_scale=0.1, parameters=PARAMETERS, moto=moto_server) as stack:
        yield stack


@pytest.fixture
def stack(module_stack: InProcessStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessStack]:
    with InvokeEndpoint(module_stack) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", endpoint.url)  # the clients follow it (sume_poller.core.aws)
        module_stack.reset()
        module_stack.invoke_endpoint = endpoint  # type: ignore[attr-defined]
        yield module_stack
    module_stack.reset()


def finished(stack: InProcessStack, kind: str, sim: dict[str, Any]) -> str:
    """A job Sume finished at once, registered and recorded by the real poll path: its id."""
    job_id: str = stack.sim.seed_job(kind, {"duration": 0, **sim})
    assert stack.submit({"kind": kind, "job_id": job_id})["status"] == "registered"
    stack.drive(lambda: stack.settled([job_id]), timeout=60)
    return job_id


def http(stack: InProcessStack, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], Any]:
    """A function URL request (payload format 2.0) to the jobs function: status, headers, JSON body."""
    event: dict[str, Any] = {"version": "2.0", "routeKey": "$default", "rawPath": path, "rawQueryString": "",
                             "headers": {"content-type": "application/json"}, "isBase64Encoded": False,
                             "requestContext": {"accountId": "123456789012", "http": {"method": method, "path": path},
                                                "authorizer": {"iam": {"userArn": "arn:aws:iam::123456789012:user/t"}},
                                                "routeKey": "$default", "stage": "$default"}}
    if body is not None:
        event["body"] = body if isinstance(body, str) else json.dumps(body)
    reply = stack.invoke("JobsFunction", event)
    return reply["statusCode"], reply["headers"], json.loads(reply["body"])


def test_a_finished_job_reads_back_whole_with_its_inline_result(stack: InProcessStack) -> None:
    job_id = finished(stack, "image", {})
    record = stack.record(job_id)
    assert record is not None and "result_json" in record

    direct = stack.invoke("JobsFunction", {"job_id": job_id})
    status, headers, over_http = http(stack, "GET", f"/jobs/{job_id}")

    assert (status, headers["Cache-Control"], over_http) == (200, "no-store", direct)
    assert set(direct) == PUBLIC
    assert direct["result"] == json.loads(record["result_json"]) and direct["result"]  # what Sume sent, parsed
    assert (direct["status"], direct["kind"], direct["result_location"], direct["result_url"]) == (
        "completed", "image", "table", None)
    assert {k: direct[k] for k in ("submitted_at", "terminal_at", "deadline_at", "reads", "found_by")} == {
        k: record[k] for k in ("submitted_at", "terminal_at", "deadline_at", "reads", "found_by")}
    assert stack.metric_totals()["Jobs_200"] == 2


def test_a_large_result_is_a_presigned_url_that_gives_the_objects_bytes(stack: InProcessStack) -> None:
    job_id = finished(stack, "image", {"result_shape": "large", "result_bytes": 2 * INLINE_RESULT_BYTES})
    record = stack.record(job_id)
    assert record is not None and "result_s3_key" in record and "result_json" not in record
    stored = stack.client("s3").get_object(Bucket=stack.outputs["ResultBucketName"], Key=record["result_s3_key"])
    expected = stored["Body"].read()

    reply = stack.invoke("JobsFunction", {"job_id": job_id})

    assert (reply["result_location"], reply["result"], reply["result_bytes"], reply["result_content_type"]) == (
        "s3", None, len(expected), stored["ContentType"])
    assert len(expected) > INLINE_RESULT_BYTES
    url = reply["result_url"]
    query = parse_qs(urlsplit(url).query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and query["X-Amz-Expires"] == ["120"]
    assert 0 < reply["result_url_expires_at"] - time.time() <= 120  # real seconds: the URL's own time
    fetched = urllib3.request("GET", url, timeout=10)
    assert fetched.status == 200 and fetched.data == expected
    assert json.loads(fetched.data)  # the result as Sume sent it
    # The URL is a bearer credential: it is in the reply, never in the function's log.
    assert url.split("?")[0] not in stack.log_path.read_text(encoding="utf-8")


def test_an_unknown_job_and_an_odd_id_are_told_apart(stack: InProcessStack) -> None:
    assert stack.invoke("JobsFunction", {"job_id": "job_nobody0000000"}) == {
        "error": {"code": "job_not_found", "message": "no job job_nobody0000000 is recorded here"}}
    status, _, body = http(stack, "GET", "/jobs/job_nobody0000000")
    assert (status, body["error"]["code"]) == (404, "job_not_found")
    status, _, body = http(stack, "GET", "/jobs/..%2F..%2Fetc%2Fpasswd")
    assert (status, body["error"]["code"]) == (400, "invalid_job_id")
    status, headers, _ = http(stack, "DELETE", "/jobs/job_nobody0000000")
    assert (status, headers["Allow"]) == (405, "GET")


def test_post_jobs_submits_through_the_submit_function_and_maps_its_replies(stack: InProcessStack) -> None:
    submission = {"kind": "image", "params": {"prompt": "http door"}, "idempotency_key": "it-http-door-0001"}

    status, headers, first = http(stack, "POST", "/jobs", submission)

    assert stack.invoke_endpoint.invoked == [("SubmitFunction", submission)]  # type: ignore[attr-defined]
    assert (status, first["status"], first["replayed"], first["idempotency_key"]) == (
        202, "submitted", False, "it-http-door-0001")
    (job_id,) = first["job_ids"]
    assert headers["Location"] == f"/jobs/{job_id}"
    assert stack.record(job_id)["status"] == "pending" and stack.queue_depth() == 1  # type: ignore[index]
    assert stack.sim.stats()["creates"] == 1

    status, _, again = http(stack, "POST", "/jobs", submission)  # the same request: a replay, billed once
    assert (status, again["job_ids"], again["replayed"]) == (200, [job_id], True)
    assert stack.sim.stats()["creates"] == 1

    _, _, read = http(stack, "GET", f"/jobs/{job_id}")
    assert (read["job_id"], read["status"], read["result_location"]) == (job_id, "pending", None)

    status, _, rejected = http(stack, "POST", "/jobs", {"kind": "hologram", "params": {}})
    assert (status, rejected["status"]) == (400, "rejected") and "kind must be one of" in rejected["error"]

    status, _, body = http(stack, "POST", "/jobs", "kind=image")
    assert (status, body["error"]["code"]) == (400, "bad_request")
    assert len(stack.invoke_endpoint.invoked) == 3  # type: ignore[attr-defined]  # never for a non-JSON body


def test_post_jobs_says_when_to_retry_a_create_sume_did_not_answer(stack: InProcessStack) -> None:
    # Every create attempt of this key fails (the submit function tries three times, then raises
    # SubmitRetryable naming Sume's Retry-After): nothing is created or billed.
    faults = {"create_faults": ["503", "503", "503:3"]}
    submission = {"kind": "image", "params": {"prompt": "sume is down", "sim": faults}, "idempotency_key": "it-503-1"}

    status, headers, body = http(stack, "POST", "/jobs", submission)

    assert (status, headers["Retry-After"], body["error"]["code"]) == (503, "3", "submit_retryable")
    assert "retry the same event after 3 s" in body["error"]["message"]
    assert stack.records() == [] and stack.sim.stats()["creates"] == 0
