"""The jobs function's two doors: a direct invoke, and HTTP behind its IAM-authorised function URL.

Direct invoke: ``{"job_id": "job_abc"}`` -> the GetJob reply (:mod:`sume_poller.api.reader`), or
``{"error": {"code", "message"}}`` (``job_not_found``, ``invalid_job_id``, ``bad_request``): a
reply without ``job_id`` is an error. A function URL request (payload format 2.0) is routed:

* ``GET /jobs/{id}`` -> 200 and the GetJob reply; 404 ``job_not_found``; 400 ``invalid_job_id``.
* ``POST /jobs`` with the submit function's direct-invoke event as a JSON body -> that function,
  invoked synchronously (:class:`SubmitDoor`), its reply as the body: 202 a new submission (any
  status but ``rejected``), 200 a replay (``"replayed": true``), 400 ``rejected`` (the reply
  carries the error); 429 (create budget exhausted) or 503 (Sume's answer unknown or transient,
  the invoke throttled or failed, the function timed out) with ``Retry-After`` - the same request
  again replays the same Idempotency-Key, so a retry never bills twice; 504 when the reply did not
  come in time (likewise retryable); 502 when the submit function failed otherwise (a bug or a
  misconfiguration: retrying will not help). 400 for a body that is not a JSON object, 413 over
  :data:`MAX_BODY`.
* Any other path 404, another method 405 (with ``Allow``).

Error bodies are ``{"error": {"code", "message"}}``. Every reply says ``Cache-Control: no-store``
(it may carry a pre-signed URL). This function never talks to Sume: it holds no Sume key.

Routing is by hand, not with Powertools' ``LambdaFunctionUrlResolver``: importing its event
handler package costs about 100 ms of CPU at cold start (190 ms without bytecode; ``python -X
importtime`` on Python 3.11, Powertools 3.37) - a sixth to a third of the functions' cold-start
floor - for two routes.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping
from dataclasses import field
from typing import Any
from urllib.parse import unquote

from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

from ..core.aws import AwsError, error_code
from ..core.jobs import InvalidJobId, validate_job_id
from ..core.observability import logger
from ..core.values import value
from .reader import JobReader

#: Largest POST body (the submit function refuses params over 64,000 bytes anyway).
MAX_BODY = 128_000
#: Retry-After when the submit function's message names no wait (seconds).
DEFAULT_RETRY_AFTER = 5
#: "retry the same event in 12 s" (CreateBudgetExhausted), "... after 3 s ..." (SubmitRetryable).
_RETRY_IN = re.compile(r"\bretry\b.*?\b(?:in|after) (\d+(?:\.\d+)?) ?s\b")
#: What the submit function raises for a failure the same event may retry (sume_poller.creates.submit).
_RETRYABLE = {"CreateBudgetExhausted": (429, "create_budget_exhausted"), "SubmitRetryable": (503, "submit_retryable")}


@value
class Reply:
    """An HTTP reply: status, JSON body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    def for_url(self) -> dict[str, Any]:
        """As a function URL returns it."""
        return {"statusCode": self.status, "body": json.dumps(self.body, separators=(",", ":"), ensure_ascii=False),
                "headers": {"Content-Type": "application/json", "Cache-Control": "no-store", **self.headers}}


def error(status: int, code: str, message: str, **headers: str) -> Reply:
    return Reply(status, {"error": {"code": code, "message": message}}, dict(headers))


def retry_after(message: object) -> int | None:
    """The seconds a submit failure's message says to wait ("retry ... in N s"), rounded up."""
    match = _RETRY_IN.search(message) if isinstance(message, str) else None
    return max(1, math.ceil(float(match.group(1)))) if match else None


def submitted(reply: Any) -> Reply:
    """The submit function's reply as HTTP: 400 rejected, 200 a replay, 202 anything else new."""
    if not isinstance(reply, dict):
        return error(502, "submit_failed", "the submit function replied with something other than a JSON object")
    if reply.get("status") == "rejected":
        return Reply(400, reply)
    if reply.get("replayed") is True:
        return Reply(200, reply)
    ids = reply.get("job_ids")
    location = {"Location": f"/jobs/{ids[0]}"} if isinstance(ids, list) and len(ids) == 1 else {}
    return Reply(202, reply, location)


def failed(payload: Any) -> Reply:
    """The submit function raised (a FunctionError): its error document as HTTP."""
    document = payload if isinstance(payload, dict) else {}
    kind, message = str(document.get("errorType") or "Unknown"), str(document.get("errorMessage") or "")[:500]
    if kind in _RETRYABLE:
        status, code = _RETRYABLE[kind]
        wait = retry_after(message) or (1 if status == 429 else DEFAULT_RETRY_AFTER)
        return error(status, code, message, **{"Retry-After": str(wait)})
    if "timed out" in message.lower() or "timeout" in kind.lower():
        return error(503, "submit_timed_out", "the submit function timed out; the same request again replays its "
                     "Idempotency-Key", **{"Retry-After": str(DEFAULT_RETRY_AFTER)})
    logger.error("the submit function failed", extra={"error_type": kind, "error_message": message})
    return error(502, "submit_failed", f"the submit function failed ({kind})")


class SubmitDoor:
    """POST /jobs: the submit function invoked synchronously with the request's body."""

    def __init__(self, lam: Any, function_name: str) -> None:
        self.lam = lam
        self.function_name = function_name

    def submit(self, event: dict[str, Any]) -> Reply:
        try:
            reply = self.lam.invoke(FunctionName=self.function_name, InvocationType="RequestResponse",
                                    Payload=json.dumps(event).encode())
            raw = reply["Payload"].read()
        except (ReadTimeoutError, ConnectTimeoutError) as exc:
            logger.warning("the submit function's reply did not come in time", extra={"reason": type(exc).__name__})
            return error(504, "submit_timed_out", "no reply from the submit function in time; the same request again "
                         "replays its Idempotency-Key", **{"Retry-After": str(DEFAULT_RETRY_AFTER)})
        except AwsError as exc:
            code = error_code(exc) or type(exc).__name__
            logger.warning("invoking the submit function failed", extra={"reason": code})
            if code == "TooManyRequestsException":
                return error(429, "submit_throttled", "the submit function is at its concurrency limit",
                             **{"Retry-After": "1"})
            return error(503, "submit_unavailable", f"the submit function could not be invoked ({code})",
                         **{"Retry-After": str(DEFAULT_RETRY_AFTER)})
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = None
        if reply.get("FunctionError"):
            return failed(payload)
        return submitted(payload)


class JobsApi:
    def __init__(self, reader: JobReader, door: SubmitDoor) -> None:
        self.reader = reader
        self.door = door

    # -- direct invoke ----------------------------------------------------------------------------
    def invoke(self, event: Any) -> Reply:
        """A direct invoke: ``{"job_id": ...}`` -> the GetJob reply (its body is what the invoke
        returns), or an error."""
        if not isinstance(event, dict) or set(event) != {"job_id"}:
            return error(400, "bad_request", 'expected {"job_id": "<id>"} or a function URL request')
        return self.get_job(event["job_id"])

    def get_job(self, raw_id: object) -> Reply:
        try:
            job_id = validate_job_id(raw_id)
        except InvalidJobId as exc:
            return error(400, "invalid_job_id", str(exc))
        logger.append_keys(job_id=job_id)
        reply = self.reader.get_job(job_id)
        if reply is None:
            return error(404, "job_not_found", f"no job {job_id} is recorded here")
        return Reply(200, reply)

    # -- HTTP (function URL, payload format 2.0) --------------------------------------------------
    def http(self, event: Mapping[str, Any]) -> Reply:
        method = str(((event.get("requestContext") or {}).get("http") or {}).get("method") or "").upper()
        parts = [p for p in str(event.get("rawPath") or "/").split("/") if p]
        if parts == ["jobs"]:
            return self._post(event) if method == "POST" else error(
                405, "method_not_allowed", f"{method} /jobs: only POST", Allow="POST")
        if len(parts) == 2 and parts[0] == "jobs":
            return self.get_job(unquote(parts[1])) if method == "GET" else error(
                405, "method_not_allowed", f"{method} /jobs/{{id}}: only GET", Allow="GET")
        return error(404, "not_found", "routes: GET /jobs/{id}, POST /jobs")

    def _post(self, event: Mapping[str, Any]) -> Reply:
        body = event.get("body") or ""
        try:
            raw = base64.b64decode(body, validate=True) if event.get("isBase64Encoded") else str(body).encode()
        except ValueError:
            return error(400, "bad_request", "the body is not valid base64")
        if len(raw) > MAX_BODY:
            return error(413, "body_too_large", f"the body is larger than {MAX_BODY} bytes")
        try:
            submission = json.loads(raw)
        except ValueError:
            submission = None
        if not isinstance(submission, dict):
            return error(400, "bad_request", "the body must be a JSON object: the submit event")
        return self.door.submit(submission)


def is_url_request(event: Any) -> bool:
    """A function URL (payload format 2.0) request, as opposed to a direct invoke."""
    return isinstance(event, dict) and event.get("version") == "2.0" and "requestContext" in event


def caller(event: Mapping[str, Any]) -> str | None:
    """Who signed the request (AWS_IAM: the caller's ARN Lambda puts in the event), for the log."""
    iam = ((event.get("requestContext") or {}).get("authorizer") or {}).get("iam") or {}
    arn = iam.get("userArn") or iam.get("callerId")
    return str(arn) if arn else None
