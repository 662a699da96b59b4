"""The jobs function (GetJob and the HTTP door to submit), over in-process fakes and botocore's
Stubber: the reply's shape (public fields only, the result inline or as a pre-signed URL), the
routes, odd input, and how the submit function's replies and failures become HTTP statuses.

Unit tier: no network (a pre-signed URL is computed locally)."""

from __future__ import annotations

import base64
import io
import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from botocore.exceptions import ReadTimeoutError
from botocore.response import StreamingBody
from botocore.stub import Stubber
from fakes import FakeStore

from sume_poller.api.jobsapi import MAX_BODY, JobsApi, Reply, SubmitDoor, caller, failed, is_url_request, retry_after
from sume_poller.api.reader import PUBLIC_FIELDS, RESULT_FIELDS, JobReader, JobsSettings, presigner
from sume_poller.config.settings import ConfigError
from sume_poller.wiring.jobs import LOCAL_PRESIGN_CONFIG, PRESIGN_CONFIG

JOB = "job_0123456789abcde4"
NOW = 1_800_000_000.0
#: Everything a terminal record with an S3 result holds, the chain's bookkeeping included.
RECORD: dict[str, Any] = {
    "job_id": JOB, "kind": "video", "profile": "video|d8", "status": "completed", "sume_status": "completed",
    "submitted_at": 1_799_999_000, "updated_at": 1_799_999_900, "deadline_at": 1_800_085_400,
    "terminal_at": 1_799_999_900, "found_by": "sweep", "reads": 4, "status_reads": 3, "result_reads": 1,
    "idempotency_key": "order-42-video", "sume_request_id": "req_1", "chain_due_at": 1_799_999_950.5,
    "fence_token": "f" * 32, "fence_seq": 3, "pending_shard": "o03", "event_pending": True,
    "event_published_at": 1_799_999_901, "seen_running_at": 1_799_999_800.0, "seen_terminal_at": 1_799_999_900.0,
    "result_s3_key": f"results/{JOB}/0a1b2c3d4e5f6a7b", "result_bytes": 31_457_280,
    "result_content_type": "application/json",
}
INTERNAL = {"profile", "status_reads", "result_reads", "expires_at", "sume_request_id", "chain_due_at",
            "fence_token", "fence_seq", "pending_shard", "event_pending", "event_published_at", "seen_running_at",
            "seen_terminal_at", "result_s3_key", "result_json"}


class Signer:
    """presign(key, seconds) that records what it signed."""

    def __init__(self) -> None:
        self.signed: list[tuple[str, int]] = []

    def __call__(self, key: str, seconds: int) -> str:
        self.signed.append((key, seconds))
        return f"https://results.s3.us-east-1.amazonaws.com/{key}?X-Amz-Expires={seconds}&X-Amz-Signature=abc"


def reader(*records: dict[str, Any], expiry: int = 300) -> tuple[JobReader, Signer]:
    store, signer = FakeStore(), Signer()
    for record in records:
        store.records[record["job_id"]] = dict(record)
    return JobReader(store, signer, expiry, wall=lambda: NOW), signer


# -- GetJob ------------------------------------------------------------------------------------------

def test_the_reply_names_the_callers_idempotency_key() -> None:
    """A caller answered "queued" (no job id yet) correlates by its own key: the reply carries it,
    as the terminal event does; a job registered by id has none."""
    jobs, _ = reader(RECORD, {**RECORD, "job_id": "job_registered", "idempotency_key": None})
    assert jobs.get_job(JOB)["idempotency_key"] == "order-42-video"  # type: ignore[index]
    assert jobs.get_job("job_registered")["idempotency_key"] is None  # type: ignore[index]


def test_a_record_past_its_ttl_is_gone_before_dynamodb_deletes_it() -> None:
    """DynamoDB deletes expired items lazily (typically within a few days) and serves them until
    then (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ttl-expired-items.html):
    GetJob answers no such job from expires_at on (real seconds), and the reply never shows it."""
    jobs, _ = reader({**RECORD, "expires_at": int(NOW)}, {**RECORD, "job_id": "job_later", "expires_at": int(NOW) + 1})
    assert jobs.get_job(JOB) is None
    later = jobs.get_job("job_later")
    assert later is not None and "expires_at" not in later


def test_an_s3_result_is_a_short_lived_url_and_no_internal_field_leaves() -> None:
    jobs, signer = reader(RECORD, expiry=120)

    reply = jobs.get_job(JOB)

    assert reply is not None
    assert list(reply) == [*PUBLIC_FIELDS, *RESULT_FIELDS]  # always every key, in this order
    assert not INTERNAL & set(reply)
    assert {k: reply[k] for k in PUBLIC_FIELDS} == {**{k: RECORD.get(k) for k in PUBLIC_FIELDS}, "key": None}
    assert signer.signed == [(RECORD["result_s3_key"], 120)]
    assert reply["result_url"] == signer(RECORD["result_s3_key"], 120)
    assert (reply["result_location"], reply["result"], reply["result_url_expires_at"], reply["result_bytes"],
            reply["result_content_type"]) == ("s3", None, int(NOW) + 120, 31_457_280, "application/json")
    assert json.loads(json.dumps(reply)) == reply  # plain JSON


def test_an_inline_result_is_the_parsed_json_and_nothing_is_signed() -> None:
    record = {k: v for k, v in RECORD.items() if not k.startswith("result_")}
    payload = {"images": [{"url": "https://cdn.example/a.png", "seed": 7}], "note": "é"}
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    jobs, signer = reader({**record, "key": "team-b", "result_json": text, "result_bytes": len(text.encode())})

    reply = jobs.get_job(JOB)

    assert reply is not None and signer.signed == []
    assert reply["key"] == "team-b"
    assert (reply["result_location"], reply["result"], reply["result_url"], reply["result_url_expires_at"],
            reply["result_bytes"], reply["result_content_type"]) == (
        "table", payload, None, None, len(text.encode()), "application/json")


def test_a_pending_job_a_failure_and_a_result_too_large_carry_no_result() -> None:
    pending = {"job_id": "job_p", "kind": "image", "status": "pending", "submitted_at": 1, "updated_at": 1,
               "deadline_at": 2, "pending_shard": "p01", "chain_due_at": 1.5}
    error = {"code": "result_too_large", "message": "the result has 600000000 bytes or more (max 500000000)"}
    large = {**pending, "job_id": "job_l", "status": "completed", "pending_shard": None, "error": error,
             "result_bytes": 600_000_000}
    jobs, signer = reader(pending, large)

    waiting, oversized = jobs.get_job("job_p"), jobs.get_job("job_l")

    assert waiting is not None and oversized is not None and signer.signed == []
    assert (waiting["status"], waiting["terminal_at"], waiting["reads"], waiting["result_location"]) == (
        "pending", None, None, None)
    assert (oversized["error"], oversized["result_bytes"], oversized["result_location"], oversized["result"]) == (
        error, 600_000_000, None, None)
    assert jobs.get_job("job_unknown") is None


def test_a_real_presigned_url_is_sigv4_on_the_buckets_regional_host_and_expires() -> None:
    session = boto3.session.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret",
                                    aws_session_token="token", region_name="eu-west-1")
    url = presigner(session.client("s3", config=PRESIGN_CONFIG), "sume-results")("results/job_1/ab", 300)
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    assert (parts.scheme, parts.netloc, parts.path) == ("https", "sume-results.s3.eu-west-1.amazonaws.com",
                                                        "/results/job_1/ab")
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and query["X-Amz-Expires"] == ["300"]
    assert query["X-Amz-Security-Token"] == ["token"]  # the role's session: the URL dies with it too
    local = session.client("s3", endpoint_url="http://127.0.0.1:5000", config=LOCAL_PRESIGN_CONFIG)
    assert presigner(local, "sume-results")("results/job_1/ab", 60).startswith(
        "http://127.0.0.1:5000/sume-results/results/job_1/ab?X-Amz-Algorithm=AWS4-HMAC-SHA256")


def test_settings_are_bounded_and_required_at_cold_start() -> None:
    env = {"JOBS_TABLE": "jobs", "RESULT_BUCKET": "results", "SUBMIT_FUNCTION_NAME": "stack-SubmitFunction-x"}
    settings = JobsSettings.from_env(env)
    assert (settings.common.jobs_table, settings.result_bucket, settings.result_url_expiry,
            settings.submit_function) == ("jobs", "results", 300, "stack-SubmitFunction-x")
    with pytest.raises(ConfigError) as refused:
        JobsSettings.from_env({"JOBS_TABLE": "jobs", "RESULT_URL_EXPIRY_SECONDS": "86400"})
    problems = str(refused.value)
    assert "RESULT_BUCKET is required" in problems and "SUBMIT_FUNCTION_NAME is required" in problems
    assert "RESULT_URL_EXPIRY_SECONDS" in problems


# -- the doors -----------------------------------------------------------------------------------------

class Door:
    """SubmitDoor's place: records what was submitted, answers with a canned Reply."""

    def __init__(self, answer: Reply | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.answer = answer or Reply(202, {"status": "submitted"})

    def submit(self, event: dict[str, Any]) -> Reply:
        self.events.append(event)
        return self.answer


def api(door: Door | None = None) -> tuple[JobsApi, Door]:
    door = door or Door()
    jobs, _ = reader(RECORD)
    return JobsApi(jobs, door), door  # type: ignore[arg-type]


def url_event(method: str, path: str, body: str | bytes | None = None, base64_body: bool = False) -> dict[str, Any]:
    event: dict[str, Any] = {"version": "2.0", "routeKey": "$default", "rawPath": path, "rawQueryString": "",
                             "headers": {}, "isBase64Encoded": base64_body,
                             "requestContext": {"http": {"method": method, "path": path}}}
    if body is not None:
        event["body"] = base64.b64encode(body if isinstance(body, bytes) else body.encode()).decode() \
            if base64_body else body
    return event


def test_direct_invoke_reads_a_job_and_refuses_anything_else() -> None:
    jobs, _ = api()
    found = jobs.invoke({"job_id": JOB})
    assert found.status == 200 and found.body["job_id"] == JOB and found.body["result_location"] == "s3"
    assert jobs.invoke({"job_id": "job_nobody"}).body == {
        "error": {"code": "job_not_found", "message": "no job job_nobody is recorded here"}}
    for odd in ({"job_id": "../../etc/passwd"}, {"job_id": 12}, {"job_id": "#stats:image"}, {"job_id": ""}):
        reply = jobs.invoke(odd)
        assert reply.status == 400 and reply.body["error"]["code"] == "invalid_job_id", odd
        assert "job_id" not in reply.body
    for odd in ({}, {"kind": "video", "job_id": JOB}, ["job_id"], "job_x", None):  # a submit event is not a read
        assert jobs.invoke(odd).body["error"]["code"] == "bad_request", odd


@pytest.mark.parametrize(("method", "path", "status", "allow"), [
    ("GET", f"/jobs/{JOB}", 200, None),
    ("GET", f"/jobs/{JOB}/", 200, None),
    ("GET", "/jobs/job_nobody", 404, None),
    ("GET", "/jobs/job%2F..%2Fx", 400, None),
    ("GET", "/jobs/job%20x", 400, None),
    ("DELETE", f"/jobs/{JOB}", 405, "GET"),
    ("POST", f"/jobs/{JOB}", 405, "GET"),
    ("GET", "/jobs", 405, "POST"),
    ("PUT", "/jobs", 405, "POST"),
    ("GET", "/", 404, None),
    ("GET", f"/jobs/{JOB}/result", 404, None),
    ("GET", "/job", 404, None),
])
def test_routes(method: str, path: str, status: int, allow: str | None) -> None:
    jobs, door = api()
    reply = jobs.http(url_event(method, path))
    assert reply.status == status, reply
    assert reply.headers.get("Allow") == allow
    assert door.events == []
    if status != 200:
        assert set(reply.body) == {"error"} and set(reply.body["error"]) == {"code", "message"}
    url = reply.for_url()
    assert url["headers"]["Content-Type"] == "application/json" and url["headers"]["Cache-Control"] == "no-store"
    assert json.loads(url["body"]) == reply.body


def test_post_forwards_the_body_as_the_submit_event() -> None:
    submission = {"kind": "image", "params": {"prompt": "ö"}, "idempotency_key": "order-42-image"}
    for base64_body in (False, True):
        jobs, door = api()
        assert jobs.http(url_event("POST", "/jobs", json.dumps(submission), base64_body)).status == 202
        assert door.events == [submission]


@pytest.mark.parametrize(("body", "base64_body", "status"), [
    (None, False, 400), ("", False, 400), ("not json", False, 400), ("[1, 2]", False, 400), ('"image"', False, 400),
    ("{", False, 400), ("%%%", True, 400), ("{}" + " " * MAX_BODY, False, 413),
])
def test_a_post_that_is_not_a_json_object_never_reaches_submit(body: str | None, base64_body: bool,
                                                              status: int) -> None:
    jobs, door = api()
    event = url_event("POST", "/jobs", body, False)
    if base64_body:
        event.update(isBase64Encoded=True)
    assert jobs.http(event).status == status
    assert door.events == []


def test_url_requests_and_their_caller_are_told_from_direct_invokes() -> None:
    signed = url_event("GET", f"/jobs/{JOB}")
    signed["requestContext"]["authorizer"] = {"iam": {"accountId": "123456789012", "callerId": "AIDAEXAMPLE",
                                                      "userArn": "arn:aws:iam::123456789012:user/orders"}}
    assert is_url_request(signed) and not is_url_request({"job_id": JOB}) and not is_url_request(None)
    assert caller(signed) == "arn:aws:iam::123456789012:user/orders"
    assert caller(url_event("GET", "/jobs/x")) is None


# -- the submit function's replies as HTTP -------------------------------------------------------------

def lambda_stub(*replies: dict[str, Any] | Exception) -> tuple[SubmitDoor, Stubber]:
    lam = boto3.session.Session(aws_access_key_id="a", aws_secret_access_key="b", region_name="us-east-1").client(
        "lambda")
    stub = Stubber(lam)
    for reply in replies:
        if isinstance(reply, Exception):
            continue
        if "error_code" in reply:
            stub.add_client_error("invoke", service_error_code=reply["error_code"], http_status_code=429)
            continue
        payload = json.dumps(reply.pop("payload")).encode()
        body = StreamingBody(io.BytesIO(payload), len(payload))
        stub.add_response("invoke", {"StatusCode": 200, "Payload": body, **reply},
                          expected_params={"FunctionName": "stack-SubmitFunction-x",
                                           "InvocationType": "RequestResponse",
                                           "Payload": json.dumps({"kind": "image"}).encode()})
    stub.activate()
    return SubmitDoor(lam, "stack-SubmitFunction-x"), stub


@pytest.mark.parametrize(("reply", "status", "location"), [
    ({"status": "submitted", "job_ids": ["job_a"], "new": ["job_a"], "replayed": False}, 202, "/jobs/job_a"),
    ({"status": "registered", "job_ids": ["job_a"], "new": ["job_a"], "replayed": False}, 202, "/jobs/job_a"),
    ({"status": "queued", "job_ids": [], "replayed": False, "queued_until": 12}, 202, None),  # any new status
    ({"status": "submitted", "job_ids": ["job_a", "job_b"], "replayed": False}, 202, None),
    ({"status": "submitted", "job_ids": ["job_a"], "new": [], "replayed": True}, 200, None),
    ({"status": "registered", "job_ids": ["job_a"], "new": [], "replayed": True}, 200, None),
    ({"status": "rejected", "error": "kind must be one of [...]", "job_ids": []}, 400, None),
])
def test_submit_replies_map_to_statuses_and_pass_through(reply: dict[str, Any], status: int,
                                                        location: str | None) -> None:
    door, stub = lambda_stub({"payload": reply})
    answer = door.submit({"kind": "image"})
    stub.assert_no_pending_responses()
    assert (answer.status, answer.body, answer.headers.get("Location")) == (status, reply, location)


@pytest.mark.parametrize(("error_type", "message", "status", "wait"), [
    ("CreateBudgetExhausted", "the Sume create budget is exhausted: retry the same event in 17 s", 429, "17"),
    ("SubmitRetryable", "Sume create did not complete (http 503); retry the same event after 4 s to replay its "
                        "Idempotency-Key", 503, "4"),
    ("SubmitRetryable", "Sume create did not complete (timeout); retry the same event to replay its "
                        "Idempotency-Key", 503, "5"),
    ("Sandbox.Timedout", "Task timed out after 30.00 seconds", 503, "5"),
])
def test_a_retryable_submit_failure_says_when_to_retry(error_type: str, message: str, status: int,
                                                       wait: str) -> None:
    door, stub = lambda_stub({"payload": {"errorMessage": message, "errorType": error_type, "stackTrace": []},
                              "FunctionError": "Unhandled"})
    answer = door.submit({"kind": "image"})
    stub.assert_no_pending_responses()
    assert (answer.status, answer.headers) == (status, {"Retry-After": wait})
    assert answer.body["error"]["code"] in ("create_budget_exhausted", "submit_retryable", "submit_timed_out")


def test_any_other_submit_failure_is_a_bad_gateway_without_its_internals() -> None:
    door, _ = lambda_stub({"payload": {"errorMessage": "invalid submit function configuration:\n  - REDIS_URL ...",
                                       "errorType": "ConfigError", "stackTrace": ["..."]},
                           "FunctionError": "Unhandled"})
    answer = door.submit({"kind": "image"})
    assert (answer.status, answer.body) == (502, {"error": {"code": "submit_failed",
                                                            "message": "the submit function failed (ConfigError)"}})
    assert "Retry-After" not in answer.headers
    assert failed(b"not an error document").status == 502


def test_an_invoke_that_fails_or_times_out_is_retryable() -> None:
    door, _ = lambda_stub({"error_code": "TooManyRequestsException"})
    throttled = door.submit({"kind": "image"})
    assert (throttled.status, throttled.headers) == (429, {"Retry-After": "1"})

    class Slow:
        def invoke(self, **_: Any) -> Any:
            raise ReadTimeoutError(endpoint_url="https://lambda.us-east-1.amazonaws.com")

    late = SubmitDoor(Slow(), "f").submit({"kind": "image"})
    assert (late.status, late.headers, late.body["error"]["code"]) == (504, {"Retry-After": "5"}, "submit_timed_out")


def test_retry_after_reads_the_seconds_from_the_message() -> None:
    assert retry_after("the Sume create budget is exhausted: retry the same event in 3 s") == 3
    assert retry_after("retry the same event after 2.5 s to replay") == 3
    assert retry_after("retry later") is None and retry_after(None) is None
