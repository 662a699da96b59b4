"""The jobs function's IAM-authorised function URL, deployed into ministack: requests signed with
SigV4 (botocore's ``SigV4Auth``, service ``lambda``, the stack's region and credentials) submit a
job (POST /jobs, through the deployed submit function) and read it back once the deployed poll
path finished it (GET /jobs/{id}); a large result's pre-signed URL gives the object's bytes; an
unsigned request is refused with 403 before the function runs.

A request is signed for the URL the stack reports (``JobsUrl``: ``https://<id>.lambda-url.<region>.on.aws/``)
and sent to ministack with that host in its ``Host`` header, as ministack routes function URLs.
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest
import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tools.stack.base import CREDENTIALS, REGION
from tools.stack.deployed import DeployedStack

pytestmark = pytest.mark.e2e

SIGNER = SigV4Auth(Credentials(CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"]), "lambda",
                   REGION)


def call(stack: DeployedStack, method: str, path: str, body: Any = None, *, signed: bool = True) -> tuple[
        int, dict[str, str], Any]:
    """A request to the jobs URL (signed with SigV4 unless ``signed=False``): status, headers, JSON body."""
    url = urlsplit(stack.outputs["JobsUrl"])
    assert url.scheme == "https" and url.hostname and url.hostname.endswith(f".lambda-url.{REGION}.on.aws")
    data = json.dumps(body).encode() if body is not None else None
    request = AWSRequest(method=method, url=f"https://{url.hostname}{path}", data=data,
                         headers={"Content-Type": "application/json"} if data else {})
    if signed:
        SIGNER.add_auth(request)
    headers = {**dict(request.headers.items()), "Host": url.hostname}
    reply = urllib3.request(method, f"{stack.endpoint_url}{path}", body=data, headers=headers, timeout=60,
                            retries=False)
    return reply.status, dict(reply.headers), json.loads(reply.data) if reply.data else None


def test_signed_requests_submit_and_read_a_job_and_unsigned_ones_are_refused(stack: DeployedStack) -> None:
    submission = {"kind": "image", "params": {"prompt": f"e2e url {uuid.uuid4().hex}", "sim": {"duration": 2}},
                  "idempotency_key": f"e2e-url-{uuid.uuid4().hex[:12]}"}

    assert call(stack, "POST", "/jobs", submission, signed=False)[0] == 403
    assert stack.sim.stats()["creates"] == 0  # refused before the function ran: nothing submitted

    status, headers, submitted = call(stack, "POST", "/jobs", submission)
    assert status == 202, submitted
    (job_id,) = submitted["job_ids"]
    assert (submitted["status"], submitted["replayed"], headers["Location"]) == ("submitted", False, f"/jobs/{job_id}")
    status, _, replayed = call(stack, "POST", "/jobs", submission)
    assert (status, replayed["job_ids"], replayed["replayed"]) == (200, [job_id], True)
    assert stack.sim.stats()["creates"] == 1

    stack.drive(lambda: stack.settled([job_id]), timeout=90, fanout_every=5)

    assert call(stack, "GET", f"/jobs/{job_id}", signed=False)[0] == 403
    status, headers, job = call(stack, "GET", f"/jobs/{job_id}")
    assert (status, headers["Cache-Control"]) == (200, "no-store"), job
    record = stack.record(job_id)
    assert record is not None
    assert (job["job_id"], job["status"], job["kind"], job["result_location"]) == (
        job_id, "completed", "image", "table")
    assert job["result"] == json.loads(record["result_json"]) and job["reads"] == record["reads"]
    assert not {"pending_shard", "fence_token", "event_pending", "chain_due_at", "result_json"} & set(job)
    assert stack.invoke("JobsFunction", {"job_id": job_id}) == job  # the direct invoke: the same reply

    status, _, missing = call(stack, "GET", "/jobs/job_nobody0000000")
    assert (status, missing["error"]["code"]) == (404, "job_not_found")
    status, _, odd = call(stack, "GET", "/jobs/job..x")
    assert (status, odd["error"]["code"]) == (400, "invalid_job_id")


def test_a_large_results_url_from_the_deployed_function_gives_its_bytes(stack: DeployedStack) -> None:
    job_id = stack.sim.seed_job("image", {"duration": 0, "result_shape": "large", "result_bytes": 250_000})
    assert stack.submit({"kind": "image", "job_id": job_id})["status"] == "registered"
    stack.drive(lambda: stack.settled([job_id]), timeout=90, fanout_every=5)
    record = stack.record(job_id)
    assert record is not None and "result_s3_key" in record
    stored = stack.client("s3").get_object(Bucket=stack.outputs["ResultBucketName"], Key=record["result_s3_key"])

    status, _, job = call(stack, "GET", f"/jobs/{job_id}")

    assert status == 200 and (job["result_location"], job["result_bytes"]) == ("s3", record["result_bytes"])
    fetched = urllib3.request("GET", job["result_url"], timeout=30, retries=False)
    assert fetched.status == 200 and fetched.data == stored["Body"].read()
