"""All AWS access: the jobs table, the poll queue and the terminal event.

Low-level boto3 clients (cheaper to create than resources), created once per container,
thread-safe, with bounded timeouts and standard-mode retries. ``AWS_ENDPOINT_URL`` (set by
local runs) points them at moto or ministack.

The job record (table ``JOBS_TABLE``, key ``job_id``)::

    job_id, kind, status ("pending" | completed | failed | canceled | expired | timed_out),
    pending_shard   "pNN" while pending, "oNN" while terminal with the event not yet published;
                    removed with the outbox flag: the sparse index "pending" lists exactly these
    deadline_at, submitted_at, updated_at, idempotency_key?, sume_request_id?
    terminal_at, sume_status, error{code,message}?, result_json?, result_truncated?, attempts
    event_pending   set by the terminal write, removed once the terminal event is on the bus
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .jobs import OUTBOX_PREFIX, PENDING, PENDING_PREFIX, shard_of

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_sqs import SQSClient

AwsError = (BotoCoreError, ClientError)
EVENT_SOURCE = "sume.poller"
EVENT_DETAIL_TYPE = "Sume Job Terminal"
#: DynamoDB items are at most 400 KB; results larger than this are stored truncated.
MAX_RESULT_BYTES = 300_000

_CONFIG = Config(
    connect_timeout=2,
    read_timeout=5,
    retries={"mode": "standard", "max_attempts": 3},
    max_pool_connections=16,
)


_session: boto3.session.Session | None = None
_session_lock = threading.Lock()


def client(service: str) -> Any:
    """A client from the container's one boto3 Session (building a Session loads its data files
    again: ~70 ms of cold start each)."""
    global _session
    with _session_lock:
        if _session is None:
            _session = boto3.session.Session()
        return _session.client(service, config=_CONFIG)  # type: ignore[call-overload]


def reset_session() -> None:
    global _session
    with _session_lock:
        _session = None


# -- DynamoDB attribute (de)serialisation, for the few shapes the record uses -------------------
def _attr(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int | float | Decimal):
        return {"N": str(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, dict):
        return {"M": {k: _attr(v) for k, v in value.items() if v is not None}}
    raise TypeError(f"cannot store {type(value).__name__}")


def _plain(attr: dict[str, Any]) -> Any:
    (kind, value), = attr.items()
    if kind == "N":
        number = Decimal(value)
        return int(number) if number == number.to_integral_value() else float(number)
    if kind == "M":
        return {k: _plain(v) for k, v in value.items()}
    if kind == "L":
        return [_plain(v) for v in value]
    if kind == "NULL":
        return None
    return value


def from_item(item: dict[str, Any]) -> dict[str, Any]:
    return {k: _plain(v) for k, v in item.items()}


@dataclass(frozen=True, slots=True)
class TerminalWrite:
    won: bool
    #: Won: the record as written. Lost: the record as it was (a duplicate, or an unfinished
    #: outbox), or None if the job is not recorded at all.
    record: dict[str, Any] | None = None


class JobStore:
    def __init__(self, table: str, ddb: DynamoDBClient | None = None) -> None:
        self.table = table
        self._ddb = ddb or client("dynamodb")

    def put_pending(self, job_id: str, kind: str, deadline_at: int, shards: int,
                    extra: dict[str, Any] | None = None) -> bool:
        """Record a new pending job. False if the job id is already recorded (nothing changes)."""
        now = int(time.time())
        item = {"job_id": job_id, "kind": kind, "status": PENDING,
                "pending_shard": shard_of(job_id, shards), "deadline_at": deadline_at,
                "submitted_at": now, "updated_at": now, **(extra or {})}
        try:
            self._ddb.put_item(
                TableName=self.table,
                Item={k: _attr(v) for k, v in item.items() if v is not None},
                ConditionExpression="attribute_not_exists(job_id)",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def get(self, job_id: str) -> dict[str, Any] | None:
        reply = self._ddb.get_item(TableName=self.table, Key={"job_id": {"S": job_id}},
                                   ConsistentRead=True)
        item = reply.get("Item")
        return from_item(item) if item else None

    def record_terminal(self, job_id: str, status: str, *, sume_status: str | None,
                        error: dict[str, str] | None, result: dict[str, Any] | None,
                        attempts: int, shards: int) -> TerminalWrite:
        """The exactly-once step: pending -> terminal, with the outbox flag set.

        Wins only while the job is in a pending partition of the index; it moves the job to an
        outbox partition, so fan-out comes back for it until the event is published even if the
        message that made this write is lost. A loser gets the old record
        (``ReturnValuesOnConditionCheckFailure``) without a second read.
        """
        now = int(time.time())
        names = {"#s": "status"}
        values: dict[str, Any] = {":s": _attr(status), ":now": _attr(now), ":t": _attr(True),
                                  ":a": _attr(attempts), ":p": _attr(PENDING_PREFIX),
                                  ":o": _attr(shard_of(job_id, shards, OUTBOX_PREFIX))}
        sets = ["#s = :s", "terminal_at = :now", "updated_at = :now", "event_pending = :t",
                "attempts = :a", "pending_shard = :o"]
        if sume_status:
            sets.append("sume_status = :ss")
            values[":ss"] = _attr(sume_status)
        if error:
            sets.append("#e = :e")
            names["#e"] = "error"
            values[":e"] = _attr(error)
        if result is not None:
            text = json.dumps(result, separators=(",", ":"), default=str)
            truncated = len(text.encode()) > MAX_RESULT_BYTES
            sets.append("result_json = :r")
            values[":r"] = _attr(text.encode()[:MAX_RESULT_BYTES].decode("utf-8", "ignore")
                                 if truncated else text)
            if truncated:
                sets.append("result_truncated = :t")
        try:
            reply = self._ddb.update_item(
                TableName=self.table,
                Key={"job_id": {"S": job_id}},
                UpdateExpression="SET " + ", ".join(sets),
                ConditionExpression="begins_with(pending_shard, :p)",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                old: Any = exc.response.get("Item")
                return TerminalWrite(False, from_item(old) if old else None)
            raise
        return TerminalWrite(True, from_item(reply["Attributes"]))

    def clear_outbox(self, job_id: str) -> bool:
        """Mark the terminal event as published (the job leaves the index). False if another
        attempt already did."""
        try:
            self._ddb.update_item(
                TableName=self.table,
                Key={"job_id": {"S": job_id}},
                UpdateExpression="REMOVE event_pending, pending_shard SET event_published_at = :now",
                ConditionExpression="attribute_exists(event_pending)",
                ExpressionAttributeValues={":now": _attr(int(time.time()))},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def pending_page(self, shard: str, start_key: dict[str, Any] | None,
                     limit: int = 100) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """One page of the sparse pending index for one shard."""
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": "pending",
            "KeyConditionExpression": "pending_shard = :p",
            "ExpressionAttributeValues": {":p": {"S": shard}},
            "Limit": limit,
        }
        if start_key:
            kwargs["ExclusiveStartKey"] = start_key
        reply = self._ddb.query(**kwargs)
        return [from_item(i) for i in reply.get("Items", [])], reply.get("LastEvaluatedKey")


class PollQueue:
    def __init__(self, url: str, sqs: SQSClient | None = None) -> None:
        self.url = url
        self._sqs = sqs or client("sqs")

    def send(self, body: str, delay_seconds: int) -> None:
        self._sqs.send_message(QueueUrl=self.url, MessageBody=body, DelaySeconds=delay_seconds)

    def send_batch(self, entries: Sequence[tuple[str, str, int]]) -> list[str]:
        """Send up to 10 ``(id, body, delay)`` entries; return the ids SQS did not accept."""
        reply = self._sqs.send_message_batch(
            QueueUrl=self.url,
            Entries=[{"Id": i, "MessageBody": b, "DelaySeconds": d} for i, b, d in entries],
        )
        return [f["Id"] for f in reply.get("Failed", [])]


class EventBus:
    def __init__(self, bus_name: str, events: EventBridgeClient | None = None) -> None:
        self.bus_name = bus_name
        self._events = events

    def _client(self) -> EventBridgeClient:
        # Created on first terminal job only: most poll invocations never need it.
        if self._events is None:
            self._events = client("events")
        return self._events

    def put_terminal(self, detail: dict[str, Any]) -> None:
        reply = self._client().put_events(Entries=[{
            "Source": EVENT_SOURCE,
            "DetailType": EVENT_DETAIL_TYPE,
            "Detail": json.dumps(detail, separators=(",", ":"), default=str),
            "EventBusName": self.bus_name,
            "Resources": [],
        }])
        if reply.get("FailedEntryCount"):
            entry = reply["Entries"][0]
            raise RuntimeError(f"PutEvents rejected the terminal event: {entry.get('ErrorCode')}")


def terminal_event(job_id: str, record: dict[str, Any]) -> dict[str, Any]:
    """The terminal event's detail, built from the record (no result payload, no URLs)."""
    return {
        "event_id": f"{job_id}:terminal",
        "job_id": job_id,
        "kind": record.get("kind"),
        "status": record.get("status"),
        "sume_status": record.get("sume_status"),
        "error": record.get("error"),
        "result_available": "result_json" in record,
        "terminal_at": record.get("terminal_at"),
        "attempts": record.get("attempts"),
    }


def chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
