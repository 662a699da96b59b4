"""GetJob: one job, as its caller may see it, in one call.

The reply is the job's record as plain JSON, its public fields only (never the chain's
bookkeeping: fence tokens, index partitions, outbox flags, due times), and its result::

    {"job_id": "job_abc", "key": "default", "idempotency_key": "order-1234", "kind": "image", "status": "completed",
     "sume_status": "completed", "error": null, "submitted_at": 1796212700, "updated_at": 1796212800,
     "terminal_at": 1796212800, "deadline_at": 1796299100, "found_by": "chain", "reads": 3,
     "result_location": "table", "result": {...}, "result_url": null, "result_url_expires_at": null,
     "result_bytes": 1234, "result_content_type": "application/json"}

Every key is always there (null where it does not apply). ``result_location`` says where the
result is, as the terminal event says it: ``"table"`` - ``result`` holds it (the record keeps
results up to 100 KB inline, as JSON); ``"s3"`` - ``result_url`` is a pre-signed S3 GetObject URL
of the object the record points at, valid for ``RESULT_URL_EXPIRY_SECONDS`` (real seconds, until
``result_url_expires_at``, epoch seconds), with the object's size and content type as Sume sent
it; null - no result (a pending job, a failure, or one too large to keep: ``result_bytes`` and
error ``result_too_large``). Times are the record's (clock seconds, see :mod:`sume_poller.core.clock`).
The URL is a bearer credential for that object until it expires: it is returned, never logged.

``idempotency_key`` is the submission's (null for a job registered by id), as the terminal event
carries it. A record past its ``expires_at`` (the deployment's RETENTION_DAYS; DynamoDB deletes
it lazily, typically within days) is answered as no such job, as it will be once deleted.

A job id that is not one (:func:`sume_poller.core.jobs.validate_job_id`) never reaches the table; the
statistics items (``#stats:...``) cannot be asked for.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, Self

from ..config.settings import Common, Env, declared, setting
from ..core.values import value

#: The record's fields a reply carries, as they are ("key": the Sume key the job belongs to, if
#: the record names one). Nothing else of the record leaves the function.
PUBLIC_FIELDS = ("job_id", "key", "idempotency_key", "kind", "status", "sume_status", "error", "submitted_at",
                 "updated_at", "terminal_at", "deadline_at", "found_by", "reads")
RESULT_FIELDS = ("result_location", "result", "result_url", "result_url_expires_at", "result_bytes",
                 "result_content_type")


@value(kw_only=True)
class JobsSettings:
    """The jobs function's settings (read once per container, :class:`~sume_poller.config.settings.ConfigError`
    at cold start). Not a :class:`~sume_poller.config.settings.FunctionSettings`: this function sends no
    poll message and touches no lease, Redis or Sume key, so it reads none of theirs."""

    what: ClassVar[str] = "jobs function"
    common: Common
    result_bucket: str = setting("RESULT_BUCKET")
    #: How long a result's pre-signed URL is valid (real seconds; the template's ResultUrlExpirySeconds).
    result_url_expiry: int = setting("RESULT_URL_EXPIRY_SECONDS", 300, 30, 3_600)
    #: The submit function POST /jobs invokes (its name or ARN).
    submit_function: str = setting("SUBMIT_FUNCTION_NAME")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        reader = Env(env)
        settings = cls(common=Common.read(reader), **declared(cls, reader))
        reader.raise_problems(cls.what)
        return settings


class Records(Protocol):
    def get(self, job_id: str) -> dict[str, Any] | None: ...


class JobReader:
    """GetJob over the job store; ``presign(key, seconds)`` makes a result object's URL."""

    def __init__(self, store: Records, presign: Callable[[str, int], str], url_expiry: int,
                 wall: Callable[[], float] = time.time) -> None:
        self.store = store
        self.presign = presign
        self.url_expiry = url_expiry
        self.wall = wall

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        """The reply for a valid job id (see the module docstring), or None: no such job here."""
        record = self.store.get(job_id)
        return None if record is None or expired(record, self.wall()) else self.reply(record)

    def reply(self, record: Mapping[str, Any]) -> dict[str, Any]:
        reply = {name: record.get(name) for name in PUBLIC_FIELDS}
        result: dict[str, Any] = dict.fromkeys(RESULT_FIELDS)
        result["result_bytes"] = record.get("result_bytes")
        if isinstance(record.get("result_s3_key"), str):
            expires_at = int(self.wall()) + self.url_expiry  # signed now: at most this (whole seconds, down)
            result.update(result_location="s3", result_url=self.presign(record["result_s3_key"], self.url_expiry),
                          result_url_expires_at=expires_at, result_content_type=record.get("result_content_type"))
        elif isinstance(record.get("result_json"), str):
            result.update(result_location="table", result=json.loads(record["result_json"]),
                          result_content_type="application/json")
        return {**reply, **result}


def expired(record: Mapping[str, Any], wall_now: float) -> bool:
    """The record is past its TTL (``expires_at``, real epoch seconds): gone, whether or not DynamoDB
    has deleted it yet."""
    expires = record.get("expires_at")
    return isinstance(expires, int | float) and not isinstance(expires, bool) and expires <= wall_now


def presigner(s3: Any, bucket: str) -> Callable[[str, int], str]:
    """``presign(key, seconds)``: a SigV4 pre-signed GetObject URL of ``bucket``/``key`` (signed
    locally with the function's credentials: no request is made)."""

    def presign(key: str, seconds: int) -> str:
        url: str = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=seconds)
        return url

    return presign
