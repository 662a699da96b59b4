"""The sample events in events/ (for `sam local invoke -e` / `make invoke`) keep their contract:

* each file has the exact shape AWS sends for its trigger (SQS, EventBridge scheduled event,
  Lambda function URL = API Gateway payload v2) and reads cleanly through Powertools' event data
  classes, and it is aimed at a template function that really has that trigger;
* each payload passes the project's own decoders: poll bodies through ``messages.parse_message``
  (the v2 and v3 samples are byte for byte what the encoder writes - v2 for a message without a
  v3 field, as the release before v3 wrote and reads it; the v1 sample is still read; the poison
  record is refused), the create queue's drain step through ``DrainMessage.parse`` (byte for
  byte what the encoder writes), submit events through ``Submitter.handle``, the webhook delivery
  through ``WebhookReceiver`` with a re-signed copy, the jobs samples through ``JobsApi`` (the POST
  /jobs sample's body through ``Submitter.handle`` too);
* a new events/*.json file fails :func:`test_every_event_file_has_a_contract` until it is added
  to ``CONTRACT`` (and to the integration tier's tests/integration/test_events_invoke.py);
* the v3 poll message schema (field names, types, what is always written) is pinned.

Webhook signatures: ``webhook_delivery.json`` is signed with ``SAMPLE_SECRET`` at its own
``x-sume-timestamp``. A static file is stale as soon as that timestamp is further than
``WebhookToleranceSeconds`` from now, so these tests (and the integration tier) re-sign a copy
with a test secret and a fresh timestamp before delivering it; the static file as it is must be
refused as a replay. To try it by hand, re-sign the same way (see ``resign``).

Unit tier: in-process fakes only, no network.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import hmac
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent, LambdaFunctionUrlEvent, SQSEvent
from fakes import FakeBudget, FakeClock, FakeLease, FakePacer, FakeQueue, FakeStore, FakeSume

from sume_poller.core.messages import (
    RESULT_PHASE,
    STATUS_PHASE,
    V3_ONLY,
    VERSION,
    Finding,
    MessageError,
    PollMessage,
    parse_message,
)
from sume_poller.creates.createqueue import DrainMessage
from sume_poller.creates.submit import SubmitSettings, Submitter, one_key
from sume_poller.discovery.webhook import WebhookReceiver, raw_body, signature
from sume_poller.schedule.planner import profile_key
from sume_poller.sume.created import Created
from tools.template import load as load_template

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events"

#: Every sample event: the template function it is for and the trigger that sends it.
CONTRACT: dict[str, tuple[str, str]] = {
    "fanout_tick.json": ("FanOutFunction", "schedule"),
    "sweep_tick.json": ("SweepFunction", "schedule"),
    "poll_message.json": ("PollFunction", "sqs"),
    "poll_message_v1.json": ("PollFunction", "sqs"),
    "poll_malformed.json": ("PollFunction", "sqs"),
    "poll_result_phase.json": ("PollFunction", "sqs"),
    "poll_message_v3.json": ("PollFunction", "sqs"),
    "sqs_create_drain.json": ("SubmitFunction", "sqs"),
    "submit_image.json": ("SubmitFunction", "invoke"),
    "submit_video.json": ("SubmitFunction", "invoke"),
    "submit_register.json": ("SubmitFunction", "invoke"),
    "webhook_delivery.json": ("WebhookFunction", "url"),
    "get_job.json": ("JobsFunction", "invoke"),
    "http_get_job.json": ("JobsFunction", "url"),
    "http_post_job.json": ("JobsFunction", "url"),
}
#: Records that are poison on purpose (file -> message ids): they must fail to parse.
POISON: dict[str, set[str]] = {"poll_malformed.json": {"2e1424d4-f796-459a-8184-9c92662be6da"}}
#: The secret the static webhook sample is signed with (a sample value, never a real one).
SAMPLE_SECRET = "whsec_sample_not_a_real_secret"
TEST_SECRET = "whsec_unit_" + "5" * 32
TOLERANCE = 300.0

# The AWS sample event shapes (`sam local generate-event` / the Lambda developer guide).
SQS_RECORD_KEYS = {"messageId", "receiptHandle", "body", "attributes", "messageAttributes", "md5OfBody",
                   "eventSource", "eventSourceARN", "awsRegion"}
SQS_ATTRIBUTE_KEYS = {"ApproximateReceiveCount", "SentTimestamp", "SenderId", "ApproximateFirstReceiveTimestamp"}
SCHEDULED_KEYS = {"version", "id", "detail-type", "source", "account", "time", "region", "resources", "detail"}
#: Function URL (payload format 2.0): the keys a request always has, and every key one may have.
URL_REQUIRED_KEYS = {"version", "routeKey", "rawPath", "rawQueryString", "headers", "requestContext",
                     "isBase64Encoded"}
URL_KEYS = URL_REQUIRED_KEYS | {"cookies", "queryStringParameters", "body", "pathParameters", "stageVariables"}
URL_CONTEXT_KEYS = {"accountId", "apiId", "domainName", "domainPrefix", "http", "requestId", "routeKey", "stage",
                    "time", "timeEpoch"}
URL_CONTEXT_OPTIONAL = {"authentication", "authorizer"}
URL_HTTP_KEYS = {"method", "path", "protocol", "sourceIp", "userAgent"}


def load(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / name).read_text(encoding="utf-8"))
    return event


def files(trigger: str) -> list[str]:
    return sorted(name for name, (_, kind) in CONTRACT.items() if kind == trigger)


def resign(event: dict[str, Any], secret: str, timestamp: int) -> dict[str, Any]:
    """A copy of a function URL delivery signed now: X-Sume-Signature = "v1=" + hex
    HMAC-SHA256(secret, "{timestamp}.{raw body}") (computed here independently of webhook.py)."""
    fresh = copy.deepcopy(event)
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + raw_body(event), hashlib.sha256).hexdigest()
    fresh["headers"].update({"x-sume-timestamp": str(timestamp), "x-sume-signature": f"v1={digest}"})
    return fresh


# ---------------------------------------------------------------------------------------------- coverage


def test_every_event_file_has_a_contract() -> None:
    """A new sample must be added to CONTRACT (and run by the integration tier) to pass."""
    assert sorted(p.name for p in EVENTS.glob("*.json")) == sorted(CONTRACT)
    assert not [p.name for p in EVENTS.iterdir() if p.suffix != ".json"], "events/ holds only JSON events"


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return dict(load_template(ROOT / "template.yaml"))


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_each_event_is_aimed_at_a_function_with_that_trigger(name: str, template: dict[str, Any]) -> None:
    function, trigger = CONTRACT[name]
    resource = template["Resources"][function]
    assert resource["Type"] == "AWS::Serverless::Function"
    props = resource["Properties"]
    sources = {e["Type"] for e in (props.get("Events") or {}).values()}
    expected = {"sqs": {"SQS"}, "schedule": {"Schedule"}, "url": set()}.get(trigger)
    # A direct invoke reaches any function, one with an event source too (SubmitFunction: the create queue).
    assert expected is None or sources == expected, f"{function} is triggered by {sources}, {name} is a {trigger} event"
    # A URL event needs a URL; a direct invoke reaches any function, one with a URL too (JobsFunction).
    assert "FunctionUrlConfig" in props if trigger == "url" else trigger == "invoke" or "FunctionUrlConfig" not in props


# ---------------------------------------------------------------------------------------------- SQS


@pytest.mark.parametrize("name", files("sqs"))
def test_sqs_events_have_the_aws_shape(name: str) -> None:
    raw = load(name)
    assert set(raw) == {"Records"} and raw["Records"]
    event = SQSEvent(raw)
    ids = []
    for record in event.records:
        assert set(record.raw_event) == SQS_RECORD_KEYS
        assert set(record.raw_event["attributes"]) == SQS_ATTRIBUTE_KEYS
        ids.append(record.message_id)
        assert re.fullmatch(r"[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}", record.message_id)
        assert record.receipt_handle
        assert record.event_source == "aws:sqs"
        assert re.fullmatch(r"arn:aws:sqs:us-east-1:\d{12}:[A-Za-z0-9_-]+", record.event_source_arn)
        assert record.aws_region == "us-east-1"
        assert record.queue_url.startswith("https://sqs.us-east-1.amazonaws.com/")
        assert record.md5_of_body == hashlib.md5(record.body.encode()).hexdigest()  # what SQS computes
        attributes = record.attributes
        assert int(attributes.approximate_receive_count) >= 1
        assert int(attributes.sent_timestamp) <= int(attributes.approximate_first_receive_timestamp)
        assert attributes.sender_id
        assert dict(record.message_attributes) == {}
    assert len(set(ids)) == len(ids), "message ids are unique in a batch"


@pytest.mark.parametrize("name", files("sqs"))
def test_poll_bodies_decode_with_the_message_parser(name: str) -> None:
    if CONTRACT[name][0] == "SubmitFunction":  # the create queue: drain steps
        for record in SQSEvent(load(name)).records:
            assert DrainMessage.parse(record.body).to_json() == record.body, "exactly what the encoder writes"
        return
    for record in SQSEvent(load(name)).records:
        if record.message_id in POISON.get(name, set()):
            with pytest.raises(MessageError):
                parse_message(record.body)
            continue
        message = parse_message(record.body)
        if json.loads(record.body)["v"] in (2, VERSION):
            assert record.body == message.to_json(), "a v2 or v3 sample is exactly what the encoder writes"


def test_every_poison_record_is_in_its_file() -> None:
    for name, poison in POISON.items():
        assert poison <= {r.message_id for r in SQSEvent(load(name)).records}
        assert len(poison) < len(load(name)["Records"]), "a poison sample also carries a good record"


def test_poll_message_is_v2_and_the_v1_sample_is_still_read() -> None:
    """The poll message a chain sends is still v2 on the wire (what the release before v3 reads), v3
    only for a step that carries a v3 field; v1 and v2 bodies in flight during a deploy still parse."""
    (v2,) = SQSEvent(load("poll_message.json")).records
    (v1,) = SQSEvent(load("poll_message_v1.json")).records
    assert json.loads(v2.body)["v"] == 2 and VERSION == 3
    assert json.loads(v1.body)["v"] == 1
    current, old = parse_message(v2.body), parse_message(v1.body)
    assert current.token is not None and current.phase == STATUS_PHASE
    assert old.token is None and old.seq == 0  # a v1 step without a token: its claim starts a chain
    assert parse_message(old.next(token="0" * 32).to_json()).v == VERSION  # it is re-written (as v2)
    assert json.loads(old.next(token="0" * 32).to_json())["v"] == 2


def test_the_v3_sample_carries_the_refusal_window_and_its_v2_form_is_poison() -> None:
    """v3 adds ``refused_since``; only a message carrying it is written as v3. The same body labelled v2
    is refused (a v2 reader - the release before - refuses v3 fields as unknown, so the encoder never
    labels one so); the v3 sample without the field is exactly what the encoder writes as v2."""
    (record,) = SQSEvent(load("poll_message_v3.json")).records
    data = json.loads(record.body)
    message = parse_message(record.body)
    assert data["v"] == VERSION == 3 and message.refused_since == data["refused_since"]
    assert message.outcome is not None and message.outcome.confirmed and message.phase == RESULT_PHASE
    with pytest.raises(MessageError, match="unknown fields"):
        parse_message(json.dumps({**data, "v": 2}))
    without = {k: v for k, v in data.items() if k != "refused_since"}
    assert message.next(refused_since=None).to_json() == json.dumps({**without, "v": 2}, separators=(",", ":"),
                                                                     sort_keys=True)


def test_the_result_phase_sample_is_a_handed_over_finishing_step() -> None:
    (record,) = SQSEvent(load("poll_result_phase.json")).records
    message = parse_message(record.body)
    assert message.phase == RESULT_PHASE and message.found_by == "sweep" and message.seq > 0
    assert message.outcome is not None and message.outcome.to_json() == {
        "status": "completed", "sume_status": "completed", "source": "list"}


# ---------------------------------------------------------------------------------------------- schedules


@pytest.mark.parametrize("name", files("schedule"))
def test_scheduled_events_have_the_aws_shape(name: str) -> None:
    function, _ = CONTRACT[name]
    raw = load(name)
    assert set(raw) == SCHEDULED_KEYS
    event = EventBridgeEvent(raw)
    assert event.version == "0"
    assert re.fullmatch(r"[0-9a-f-]{36}", event.get_id)
    assert (event.source, event.detail_type, event.detail) == ("aws.events", "Scheduled Event", {})
    assert re.fullmatch(r"\d{12}", event.account) and event.region == "us-east-1"
    assert datetime.strptime(event.time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    (rule,) = event.resources
    assert re.fullmatch(rf"arn:aws:events:us-east-1:{event.account}:rule/sume-poller-{function}Tick-\w+", rule)


# ---------------------------------------------------------------------------------------------- function URL


def test_webhook_delivery_has_the_function_url_shape() -> None:
    raw = load("webhook_delivery.json")
    assert URL_REQUIRED_KEYS <= set(raw) <= URL_KEYS
    assert URL_CONTEXT_KEYS <= set(raw["requestContext"]) <= URL_CONTEXT_KEYS | URL_CONTEXT_OPTIONAL
    assert set(raw["requestContext"]["http"]) == URL_HTTP_KEYS
    event = LambdaFunctionUrlEvent(raw)
    assert (event.version, event.route_key, event.raw_path, event.raw_query_string) == ("2.0", "$default", "/", "")
    context = event.request_context
    assert (context.route_key, context.stage, context.http.method, context.http.path) == \
        ("$default", "$default", "POST", "/")
    assert context.account_id == "anonymous"  # AuthType NONE: no IAM caller
    assert context.domain_name == f"{context.api_id}.lambda-url.us-east-1.on.aws" == event.headers["host"]
    assert context.domain_prefix == context.api_id
    assert 0 <= context.time_epoch - datetime.strptime(context.time, "%d/%b/%Y:%H:%M:%S %z").timestamp() * 1000 < 1000
    assert all(name == name.lower() for name in event.headers), "function URLs deliver header names lowercased"
    assert event.is_base64_encoded is False and event.body is not None
    assert event.headers["content-type"] == "application/json"
    assert int(event.headers["content-length"]) == len(raw_body(raw))
    assert event.json_body["data"]["job_id"] and event.json_body["id"] == event.headers["x-sume-event-id"]


def test_the_static_signature_is_the_documented_hmac_of_its_own_timestamp() -> None:
    raw = load("webhook_delivery.json")
    stamp = int(raw["headers"]["x-sume-timestamp"])
    assert raw["headers"]["x-sume-signature"] == resign(raw, SAMPLE_SECRET, stamp)["headers"]["x-sume-signature"]
    assert signature(SAMPLE_SECRET, str(stamp), raw_body(raw)) == raw["headers"]["x-sume-signature"]


class Webhook:
    """WebhookReceiver over fakes, with the sample's job pending and its chain resting at T:0."""

    def __init__(self, now: float, secret: str) -> None:
        self.clock, self.store, self.lease, self.queue = FakeClock(now), FakeStore(), FakeLease(), FakeQueue()
        self.receiver = WebhookReceiver(self.clock, secret=lambda: secret, tolerance=TOLERANCE,  # type: ignore[arg-type]
                                        store=self.store, lease=self.lease, queue=self.queue,  # type: ignore[arg-type]
                                        handover_ttl_real=60.0)

    def pending(self, job_id: str, token: str) -> None:
        self.store.put_pending(job_id, "video", now=self.clock.now() - 60, deadline_at=int(self.clock.now()) + 86_400)
        self.lease.values[job_id] = f"{token}:0"

    def deliver(self, event: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        answer = self.receiver.handle(LambdaFunctionUrlEvent(event).headers, raw_body(event))
        return answer.status, answer.body


def test_a_re_signed_delivery_is_verified_and_queues_a_read_now() -> None:
    raw = load("webhook_delivery.json")
    job_id = raw_json_job(raw)
    hook = Webhook(now=1_800_000_000.0, secret=TEST_SECRET)
    hook.pending(job_id, "a" * 32)

    status, body = hook.deliver(resign(raw, TEST_SECRET, int(hook.clock.now())))

    assert (status, body) == (202, {"job_id": job_id, "queued": True})
    (sent,) = hook.queue.sent
    message = parse_message(sent.body)
    assert (message.job_id, message.token, message.seq, message.found_by) == (job_id, "a" * 32, 1, "webhook")
    assert message.due_at == pytest.approx(hook.clock.now(), abs=0.01)
    assert hook.lease.values[job_id] == f"{'a' * 32}:1*"  # the chain's waiting step is handed over


def test_the_static_file_verifies_at_its_own_time_and_is_a_replay_later() -> None:
    raw = load("webhook_delivery.json")
    stamp = int(raw["headers"]["x-sume-timestamp"])
    then = Webhook(now=float(stamp), secret=SAMPLE_SECRET)
    then.pending(raw_json_job(raw), "b" * 32)
    assert then.deliver(raw)[0] == 202

    later = Webhook(now=stamp + TOLERANCE + 1, secret=SAMPLE_SECRET)
    later.pending(raw_json_job(raw), "b" * 32)
    assert later.deliver(raw) == (401, {"error": "timestamp outside the tolerance"})
    assert later.queue.sent == []


def test_a_delivery_signed_with_another_secret_is_refused() -> None:
    raw = load("webhook_delivery.json")
    hook = Webhook(now=1_800_000_000.0, secret=TEST_SECRET)
    hook.pending(raw_json_job(raw), "c" * 32)
    assert hook.deliver(resign(raw, TEST_SECRET + "x", int(hook.clock.now()))) == (401, {"error": "bad signature"})
    assert hook.queue.sent == []


def raw_json_job(event: dict[str, Any]) -> str:
    job_id: str = json.loads(raw_body(event))["data"]["job_id"]
    return job_id


# ---------------------------------------------------------------------------------------------- jobs

JOBS_ENV = {"JOBS_TABLE": "jobs", "RESULT_BUCKET": "results", "SUBMIT_FUNCTION_NAME": "sume-poller-SubmitFunction"}


@pytest.mark.parametrize("name", ["http_get_job.json", "http_post_job.json"])
def test_jobs_requests_have_the_function_url_shape_of_a_signed_caller(name: str) -> None:
    raw = load(name)
    assert URL_REQUIRED_KEYS <= set(raw) <= URL_KEYS
    assert URL_CONTEXT_KEYS | {"authorizer"} == set(raw["requestContext"])
    assert set(raw["requestContext"]["http"]) == URL_HTTP_KEYS
    event = LambdaFunctionUrlEvent(raw)
    context = event.request_context
    assert (event.version, event.route_key, event.raw_query_string, context.route_key, context.stage) == (
        "2.0", "$default", "", "$default", "$default")
    assert context.http.path == event.raw_path and context.http.method == ("GET" if "get" in name else "POST")
    assert context.domain_name == f"{context.api_id}.lambda-url.us-east-1.on.aws" == event.headers["host"]
    # AuthType AWS_IAM: the caller's account and identity, never "anonymous"
    iam = context.authorizer.iam
    assert re.fullmatch(r"\d{12}", context.account_id) and iam.account_id == context.account_id
    assert iam.user_arn.startswith(f"arn:aws:iam::{context.account_id}:") and iam.caller_id and iam.access_key
    assert 0 <= context.time_epoch - datetime.strptime(context.time, "%d/%b/%Y:%H:%M:%S %z").timestamp() * 1000 < 1000
    assert all(header == header.lower() for header in event.headers)
    if event.body is not None:
        assert int(event.headers["content-length"]) == len(raw_body(raw))
        assert event.headers["content-type"] == "application/json"


class CapturingDoor:
    """The submit door's place: what POST /jobs would invoke the submit function with."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def submit(self, event: dict[str, Any]) -> Any:
        from sume_poller.api.jobsapi import Reply

        self.events.append(event)
        return Reply(202, {"status": "submitted"})


def test_the_jobs_samples_read_one_recorded_job_and_post_a_submit_event() -> None:
    from sume_poller.api.jobsapi import JobsApi
    from sume_poller.api.reader import JobReader, JobsSettings

    settings = JobsSettings.from_env(JOBS_ENV)
    job_id = load("get_job.json")["job_id"]
    store, door = FakeStore(), CapturingDoor()
    store.put_pending(job_id, "image", now=1_800_000_000.0, deadline_at=1_800_086_400)
    api = JobsApi(JobReader(store, lambda key, seconds: "unused", settings.result_url_expiry), door)  # type: ignore[arg-type]

    direct = api.invoke(load("get_job.json"))
    over_http = api.http(load("http_get_job.json"))
    posted = api.http(load("http_post_job.json"))

    assert (direct.status, direct.body["job_id"], direct.body["status"]) == (200, job_id, "pending")
    assert (over_http.status, over_http.body) == (200, direct.body)
    assert posted.status == 202 and door.events == [submit_event("http_post_job.json")]


def submit_event(name: str) -> dict[str, Any]:
    """A submit function's direct-invoke event: the file, or the body a POST /jobs sample carries."""
    event = load(name)
    return json.loads(event["body"]) if "requestContext" in event else event  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------------- submit

SUBMIT_ENV = {"JOBS_TABLE": "jobs", "POLL_QUEUE_URL": "q", "SUME_BASE_URL": "https://sume.test/api/v1",
              "SUME_API_KEY_NAME": "/k", "REDIS_URL": "rediss://cache.example:6379"}


@pytest.mark.parametrize("name", [*(n for n in files("invoke") if CONTRACT[n][0] == "SubmitFunction"),
                                  "http_post_job.json"])
def test_submit_events_are_accepted_by_the_submitter(name: str) -> None:
    event = submit_event(name)
    sume, store, queue, lease = FakeSume(creates=[Created(("job_fedcba9876543210",), "req_1")]), FakeStore(), \
        FakeQueue(), FakeLease()
    settings = SubmitSettings.from_env(SUBMIT_ENV)
    settings = dataclasses.replace(settings, common=dataclasses.replace(settings.common, clock=FakeClock()))
    submitter = Submitter(settings, keys=one_key(sume, FakeBudget(), FakePacer()),  # type: ignore[arg-type]
                          store=store, queue=queue, lease=lease, sleep=lambda _: None)  # type: ignore[arg-type]

    reply = submitter.handle(event, lambda: 25_000)

    assert reply["status"] == ("registered" if "job_id" in event else "submitted"), reply
    (job_id,) = reply["job_ids"]
    assert reply["new"] == [job_id] and reply["replayed"] is False
    if "job_id" in event:
        assert job_id == event["job_id"] and sume.calls == []  # nothing is created, nothing is billed
    else:
        assert sume.calls == [("create", event["idempotency_key"])] == [("create", reply["idempotency_key"])]
        assert store.records[job_id]["profile"] == profile_key(event["kind"], event["params"])
    (first,) = queue.sent
    message = parse_message(first.body)
    assert (message.job_id, message.kind, message.seq, message.v) == (job_id, event["kind"], 0, VERSION)
    assert lease.values[job_id] == f"{message.token}:0"


def test_the_create_samples_carry_parameters_that_refine_the_schedule_profile() -> None:
    assert profile_key("image", load("submit_image.json")["params"]) == "image|mp1"
    assert profile_key("video", load("submit_video.json")["params"]) == "video|d8|mp1"


# ---------------------------------------------------------------------------------------------- v2 schema

#: The v3 poll message, field by field (annotations as written in messages.py). Changing a field,
#: its type or its default changes what is in the queue during a deploy: bump VERSION and keep
#: reading the previous one (as v2 and v1 are read now), then update this pin. (v3: ``refused_since``;
#: ``outcome`` typed, the same JSON object as v2's.)
V3_FIELDS: dict[str, tuple[str, Any]] = {
    "job_id": ("str", dataclasses.MISSING),
    "kind": ("str", dataclasses.MISSING),
    "deadline_at": ("int", dataclasses.MISSING),
    "due_at": ("float", dataclasses.MISSING),
    "token": ("str | None", None),
    "seq": ("int", 0),
    "submitted_at": ("int | None", None),
    "profile": ("str | None", None),
    "reads": ("int", 0),
    "result_reads": ("int", 0),
    "errors": ("int", 0),
    "seen_running_at": ("float | None", None),
    "phase": ("str", "status"),
    "outcome": ("Finding | None", None),
    "seen_terminal_at": ("float | None", None),
    "result_waits": ("int", 0),
    "slot_at": ("float | None", None),
    "found_by": ("str | None", None),
    "normal_due": ("float | None", None),
    "paced_at": ("float | None", None),
    "key": ("str | None", None),
    "refused_since": ("float | None", None),
    "v": ("int", 3),
}
#: JSON types of each field in a body (bool is never an int here).
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "job_id": (str,), "kind": (str,), "deadline_at": (int,), "due_at": (int, float), "token": (str,), "seq": (int,),
    "submitted_at": (int,), "profile": (str,), "reads": (int,), "result_reads": (int,), "errors": (int,),
    "seen_running_at": (int, float), "phase": (str,), "outcome": (dict,), "seen_terminal_at": (int, float),
    "result_waits": (int,), "slot_at": (int, float), "found_by": (str,), "normal_due": (int, float),
    "paced_at": (int, float), "key": (str,), "refused_since": (int, float), "v": (int,),
}
#: What every v2 body carries (None-valued fields are left out).
ALWAYS_WRITTEN = {"v", "job_id", "kind", "deadline_at", "due_at", "token", "seq", "reads", "result_reads", "errors",
                  "phase", "result_waits"}


def test_the_v3_schema_is_pinned() -> None:
    assert VERSION == 3
    pinned = {f.name: (f.type, f.default) for f in dataclasses.fields(PollMessage)}
    assert pinned == V3_FIELDS
    assert set(JSON_TYPES) == set(V3_FIELDS)
    minimal = PollMessage(job_id="job_1", kind="image", deadline_at=1_900_000_000, due_at=1.5, token="d" * 32)
    body = minimal.to_json()
    assert set(json.loads(body)) == ALWAYS_WRITTEN
    assert body == json.dumps(json.loads(body), separators=(",", ":"), sort_keys=True)  # canonical: sorted, compact


@pytest.mark.parametrize("name", files("sqs"))
def test_v2_and_v3_sample_bodies_have_the_pinned_json_types(name: str) -> None:
    for record in SQSEvent(load(name)).records:
        if record.message_id in POISON.get(name, set()) or json.loads(record.body)["v"] not in (2, VERSION):
            continue
        data = json.loads(record.body)
        assert ALWAYS_WRITTEN <= set(data) <= set(V3_FIELDS) - (V3_ONLY if data["v"] == 2 else set())
        for key, value in data.items():
            assert isinstance(value, JSON_TYPES[key]) and not isinstance(value, bool), (key, value)
        typed = {k: float(v) if V3_FIELDS[k][0].startswith("float") else v for k, v in data.items()}
        assert parse_message(record.body) == PollMessage(**{**typed, "outcome": Finding.parse(data.get("outcome"))})


def test_a_v2_body_with_a_field_outside_the_schema_is_poison() -> None:
    (record,) = SQSEvent(load("poll_message.json")).records
    with pytest.raises(MessageError, match="unknown fields"):
        parse_message(json.dumps({**json.loads(record.body), "attempt": 0}))  # v1's name for reads
