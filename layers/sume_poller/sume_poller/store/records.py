"""The job store: one DynamoDB table of job records, plus large results in S3.

The job record (key ``job_id``; numbers are clock seconds)::

    job_id, kind, profile, status ("pending" | completed | failed | canceled | expired | timed_out)
    key             the Sume key the job belongs to (absent in records from before keys: the default)
    pending_shard   "pNN" while pending ("pNN:<key>" for a key other than the default), "oNN" while
                    terminal with its outbox not yet done; removed when the outbox is done: the
                    sparse index "pending" lists exactly these
    submitted_at, updated_at, deadline_at, idempotency_key?, sume_request_id?
    chain_due_at    fan-out leaves the job alone until then: while pending, when the job's chain
                    next reads (kept while Redis is down, and by submit); while its outbox is
                    open, when the publish claim expires
    fence_token, fence_seq   the chain step that may read while Redis is down
    terminal_at, sume_status, error{code,message}?, reads, status_reads, result_reads
    evidence        what the outcome rests on (:class:`~sume_poller.core.jobs.Evidence`): status_read |
                    result_read | webhook | deadline | key_removed
    found_by        "chain" | "sweep" | "webhook": who learned first that the job was finished
    seen_running_at, seen_terminal_at   bounds of the completion time (for the learned schedule)
    result_json (inline, up to INLINE_RESULT_BYTES) | result_s3_key + result_bytes + result_content_type
    event_pending   set by the terminal write; cleared once the event is on the bus
    event_claim     the token of the one actor that may publish the event, until chain_due_at
    event_published_at   when the outbox was done
    expires_at      set with that clearing when the deployment keeps jobs for a while (RETENTION_DAYS):
                    real epoch seconds, the table's TTL attribute; never on a pending job or one
                    still owing its event. DynamoDB deletes lazily: readers treat it as gone from then

The exactly-once step is :meth:`JobStore.record_terminal`: a conditional write that wins only
while the job is pending. The winner moves the job to the outbox partition and, in the same
write, takes the *publish claim* (``event_claim`` until ``chain_due_at``). Only the claim's holder
publishes: anyone else who finds the outbox open (a loser of the terminal write, a redelivery, a
fan-out tick's outbox message) takes the claim first (:meth:`JobStore.claim_outbox`, a conditional
write that wins only once the claim expired or was released) and otherwise leaves the outbox to its
holder. The holder records the observation, claims the result object, publishes the event and
clears the outbox (:mod:`sume_poller.poll.outbox`).

Large results (:class:`ResultBucket`) are streamed to S3 before that write, each attempt to a key
of its own (``results/<job_id>/<attempt>``) tagged ``sume-poller-attempt=unclaimed``: the record
points at the object of the attempt whose write won, the outbox removes that object's tag, and
the objects of attempts that lost are deleted by them or, should they die first, expired by the
bucket's lifecycle rule on the tag. So the object a record points at is always the one its own
attempt wrote (results with signed URLs differ from fetch to fetch).

Per-profile observations live in items keyed ``#stats:<profile>``
(job ids never start with ``#``), one slot per job, so writing one twice changes nothing; the
item ``#keys`` names every Sume key other than the default that jobs were recorded for. Queued
submissions (``#q:...`` items in the index's ``q:<key>`` partitions) and submission records
(``#sub:...``) are :mod:`sume_poller.store.submissions`' (the create queue's table).

Numbers come back from boto3's deserializer as ``Decimal``; :func:`plain` turns them into
``int`` or ``float`` at this boundary, so callers and the terminal event see plain JSON types.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import field
from decimal import Decimal
from typing import Any, Protocol

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from ..config.settings import RESULT_UPLOAD_STREAMS
from ..core.aws import AwsError, client, error_code
from ..core.jobs import OUTBOX_PREFIX, PENDING, PENDING_PREFIX, Evidence, keyed_shard, shard_of
from ..core.values import value
from .submissions import QUEUED, UNKNOWN_CREATES, queue_shard, submission_id

#: What a page of the pending index returns of each record: what fan-out reads (the template's index
#: projects these, ``profile`` and the partition). Without the partition attribute (and any other unread
#: one), the service serializes and the client parses less per item: on moto, a sixth less of a page's
#: cost. ``profile`` is left out too: a chain's first step reads the record and takes it from there.
PAGE_FIELDS = ("job_id", "kind", "deadline_at", "submitted_at", "chain_due_at")

#: Results up to this size stay in the record; larger ones go to S3 (items are at most 400 KB).
INLINE_RESULT_BYTES = 100_000
#: The tag of a result object no terminal write has claimed yet (the bucket's lifecycle expires them).
ATTEMPT_TAG = ("sume-poller-attempt", "unclaimed")
#: Large results streamed at once per container, and the piece of one held in memory: the bytes in
#: flight are bounded by their product whatever a batch fetches (S3's multipart parts are >= 5 MiB).
UPLOAD_STREAMS = RESULT_UPLOAD_STREAMS
#: The table's TTL attribute (template.yaml's TimeToLiveSpecification): real epoch seconds.
EXPIRES_AT = "expires_at"
DAY_SECONDS = 86_400
UPLOAD_PART_BYTES = 8 * 1024 * 1024
#: Observation slots per profile item: the newest job in a slot wins (bounded, recent-weighted).
STATS_SLOTS = 200
STATS_PREFIX = "#stats:"
#: The item naming every Sume key jobs were recorded for (job ids never start with "#").
KEYS_ITEM = "#keys"

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def stats_slot(job_id: str) -> int:
    """The observation slot of a job in its profile's item (two jobs may share one: the newer wins)."""
    return int(hashlib.sha256(job_id.encode()).hexdigest(), 16) % STATS_SLOTS


def plain(value: Any) -> Any:
    """Decimals (from DynamoDB) as int or float, recursively."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | set):
        return [plain(v) for v in value]
    return value


def _storable(value: Any) -> Any:
    """Floats as Decimal (TypeSerializer refuses floats); None values dropped from maps."""
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _storable(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_storable(v) for v in value]
    return value


def to_attrs(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _serializer.serialize(_storable(v)) for k, v in values.items() if v is not None}


def from_item(item: dict[str, Any]) -> dict[str, Any]:
    return {k: plain(_deserializer.deserialize(v)) for k, v in item.items()}


@value
class TerminalWrite:
    """The conditional terminal write's outcome: whether this chain won it, and the record."""

    won: bool
    #: Won: the record as written. Lost: the record as it was, or None if it does not exist.
    record: dict[str, Any] | None = None
    #: A won publish claim took over one its holder neither finished nor released (it expired).
    took_over: bool = False


@value
class PublishClaim:
    """The right to publish one job's terminal event: ``token`` holds it until ``until`` (clock seconds)."""

    token: str
    until: float


@value
class Ending:
    """What the terminal write records."""

    status: str
    sume_status: str | None = None
    error: dict[str, str] | None = None
    #: Where the result is: ``result_json`` inline, or ``result_s3_key`` (+ size, content type).
    result: dict[str, Any] = field(default_factory=dict)
    status_reads: int = 0
    result_reads: int = 0
    seen_running_at: float | None = None
    seen_terminal_at: float | None = None
    #: Who learned the job was finished: its chain, a sweep or a webhook.
    found_by: str = "chain"
    #: What the outcome rests on (:class:`~sume_poller.core.jobs.Evidence`).
    evidence: str = Evidence.STATUS


class Readable(Protocol):
    content_type: str
    size: int

    def read(self, amount: int = -1) -> bytes: ...


class ResultBucket:
    """Results too large for the record, one S3 object per attempt (see the module docstring)."""

    def __init__(self, bucket: str, s3: Any = None, streams: int = UPLOAD_STREAMS) -> None:
        self.bucket = bucket
        self._s3 = s3
        self._streams = threading.BoundedSemaphore(streams)

    @property
    def s3(self) -> Any:
        if self._s3 is None:
            self._s3 = client("s3")
        return self._s3

    @staticmethod
    def attempt_key(job_id: str) -> str:
        return f"results/{job_id}/{secrets.token_hex(8)}"

    def put(self, job_id: str, body: bytes, content_type: str = "application/json") -> dict[str, Any]:
        """Store a body already in memory; the record fields that point at it."""
        key = self.attempt_key(job_id)
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType=content_type,
                           Tagging="=".join(ATTEMPT_TAG))
        return {"result_s3_key": key, "result_bytes": len(body), "result_content_type": content_type}

    def upload(self, job_id: str, stream: Readable) -> dict[str, Any]:
        """Stream ``stream`` to S3, one ``UPLOAD_PART_BYTES`` part in memory at a time, at most
        ``UPLOAD_STREAMS`` uploads at once per container; the record fields that point at it.
        Not s3transfer's ``upload_fileobj``: for a stream it cannot seek it holds each part two or
        three times over (its threshold buffer, the part cut from it, a copy to wrap it)."""
        key = self.attempt_key(job_id)
        with self._streams:
            self._send(key, stream)
        return {"result_s3_key": key, "result_bytes": stream.size, "result_content_type": stream.content_type}

    def _send(self, key: str, stream: Readable) -> None:
        tagging, part = "=".join(ATTEMPT_TAG), stream.read(UPLOAD_PART_BYTES)
        if len(part) < UPLOAD_PART_BYTES:  # all of it: one plain PUT
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=part, ContentType=stream.content_type, Tagging=tagging)
            return
        upload = self.s3.create_multipart_upload(Bucket=self.bucket, Key=key, ContentType=stream.content_type,
                                                 Tagging=tagging)["UploadId"]
        parts: list[dict[str, Any]] = []
        try:
            while part:
                number = len(parts) + 1
                reply = self.s3.upload_part(Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number, Body=part)
                parts.append({"ETag": reply["ETag"], "PartNumber": number})
                del part  # the only reference: this part is gone before the next is read
                part = stream.read(UPLOAD_PART_BYTES)
            self.s3.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload,
                                              MultipartUpload={"Parts": parts})
        except BaseException:
            with contextlib.suppress(*AwsError):  # the bucket's lifecycle rule aborts it otherwise
                self.s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
            raise

    def claim(self, key: str) -> None:
        """The record points at this object: it no longer expires (safe to repeat)."""
        self.s3.delete_object_tagging(Bucket=self.bucket, Key=key)

    def discard(self, key: str) -> None:
        """An attempt that lost the terminal write removes its object (the lifecycle rule would)."""
        self.s3.delete_object(Bucket=self.bucket, Key=key)


class JobStore:
    def __init__(self, table: str, shards: int, ddb: Any = None, results: ResultBucket | None = None, *,
                 retention_days: int = 0, wall: Callable[[], float] = time.time) -> None:
        self.table = table
        self.shards = shards
        self._ddb = ddb or client("dynamodb")
        self.results = results
        #: Days a finished record is kept once its outbox is done (0: forever).
        self.retention_days = retention_days
        #: Real time, for the TTL (DynamoDB compares it with the wall clock, never the functions' clock).
        self._wall = wall

    # -- writes -------------------------------------------------------------------------------
    def put_pending(self, job_id: str, kind: str, *, now: float, deadline_at: int,
                    profile: str | None = None, chain_due_at: float | None = None,
                    extra: dict[str, Any] | None = None, key: str | None = None, own_partition: bool = False) -> bool:
        """Record a new pending job of Sume key ``key``, in that key's own partitions of the pending
        index when ``own_partition`` (every key but the default). False if the job id is already
        recorded (nothing changes)."""
        shard = keyed_shard(shard_of(job_id, self.shards), key if own_partition else None)
        item = {"job_id": job_id, "kind": kind, "profile": profile or kind, "status": PENDING, "key": key,
                "pending_shard": shard, "deadline_at": deadline_at,
                "submitted_at": int(now), "updated_at": int(now), "chain_due_at": chain_due_at, **(extra or {})}
        return self._conditional(self._ddb.put_item, TableName=self.table, Item=to_attrs(item),
                                 ConditionExpression="attribute_not_exists(job_id)")

    def record_terminal(self, job_id: str, outcome: Ending, *, now: float,
                        claim: PublishClaim | None = None) -> TerminalWrite:
        """pending -> terminal, once, the winner holding the publish ``claim``. A loser gets the record
        as it was, without a second read."""
        values: dict[str, Any] = {
            "status": outcome.status, "terminal_at": int(now), "updated_at": int(now), "event_pending": True,
            "pending_shard": shard_of(job_id, self.shards, OUTBOX_PREFIX), "sume_status": outcome.sume_status,
            "error": outcome.error, "status_reads": outcome.status_reads, "result_reads": outcome.result_reads,
            "reads": outcome.status_reads + outcome.result_reads,
            "seen_running_at": outcome.seen_running_at, "seen_terminal_at": outcome.seen_terminal_at,
            "found_by": outcome.found_by, "evidence": str(outcome.evidence), **outcome.result,
            **({"event_claim": claim.token, "chain_due_at": claim.until} if claim is not None else {}),
        }
        present = {k: v for k, v in values.items() if v is not None}
        names = {f"#a{i}": k for i, k in enumerate(present)}
        attrs = to_attrs({f":v{i}": v for i, v in enumerate(present.values())})
        attrs[":p"] = _serializer.serialize(PENDING_PREFIX)
        return self._update_or_old(
            Key=to_attrs({"job_id": job_id}),
            UpdateExpression="SET " + ", ".join(f"#a{i} = :v{i}" for i in range(len(present))),
            ConditionExpression="begins_with(pending_shard, :p)",
            ExpressionAttributeNames=names, ExpressionAttributeValues=attrs, ReturnValues="ALL_NEW")

    def result_fields(self, job_id: str, result: Any) -> dict[str, Any]:
        """The record fields of a parsed result: inline up to ``INLINE_RESULT_BYTES``, else its
        JSON text in S3 (one object of this attempt, see :class:`ResultBucket`)."""
        text = json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) <= INLINE_RESULT_BYTES or self.results is None:
            return {"result_json": text.decode(), "result_bytes": len(text)}
        return self.results.put(job_id, text)

    def claim_outbox(self, job_id: str, claim: PublishClaim, *, now: float) -> TerminalWrite:
        """Take the publish claim of an open outbox, once no one holds it (never claimed, released, or
        expired at ``now``). Won: the record with this claim (``took_over``: from a holder that neither
        finished nor released it). Lost: the record as it was (its outbox done, or claimed), or None."""
        try:
            reply = self._ddb.update_item(
                TableName=self.table, Key=to_attrs({"job_id": job_id}),
                UpdateExpression="SET event_claim = :t, chain_due_at = :until",
                ConditionExpression="attribute_exists(event_pending) AND "
                                    "(attribute_not_exists(chain_due_at) OR chain_due_at <= :now)",
                ExpressionAttributeValues=to_attrs({":t": claim.token, ":until": claim.until, ":now": now}),
                ReturnValues="ALL_OLD", ReturnValuesOnConditionCheckFailure="ALL_OLD")
        except Exception as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            old = getattr(exc, "response", {}).get("Item")
            return TerminalWrite(False, from_item(old) if old else None)
        record = from_item(reply.get("Attributes") or {})
        took_over = "event_claim" in record
        return TerminalWrite(True, {**record, "event_claim": claim.token, "chain_due_at": claim.until}, took_over)

    def release_claim(self, job_id: str, token: str) -> bool:
        """The holder did not publish (it knows): the claim is free at once. False: not held by ``token``."""
        return self._conditional(
            self._ddb.update_item, TableName=self.table, Key=to_attrs({"job_id": job_id}),
            UpdateExpression="REMOVE event_claim SET chain_due_at = :zero",
            ConditionExpression="event_claim = :t AND attribute_exists(event_pending)",
            ExpressionAttributeValues=to_attrs({":t": token, ":zero": 0}))

    def clear_outbox(self, job_id: str, *, now: float) -> bool:
        """The terminal event is on the bus: the job leaves the index, and - with a retention - may
        expire from now on (its TTL, only here: a record still owing its event never expires).
        False if already done."""
        values: dict[str, Any] = {":now": int(now)}
        update = "REMOVE event_pending, pending_shard, event_claim SET event_published_at = :now"
        if self.retention_days:
            values[":expires"] = int(self._wall()) + self.retention_days * DAY_SECONDS
            update += f", {EXPIRES_AT} = :expires"
        return self._conditional(
            self._ddb.update_item, TableName=self.table, Key=to_attrs({"job_id": job_id}),
            UpdateExpression=update, ConditionExpression="attribute_exists(event_pending)",
            ExpressionAttributeValues=to_attrs(values))

    def fence(self, job_id: str, token: str, seq: int, *, now: float, hold: float) -> TerminalWrite:
        """While Redis is down: let chain step ``token:seq`` read, once. Won: it may read (and
        ``chain_due_at`` keeps fan-out, and any other chain, off the job for ``hold`` seconds).
        Lost: a duplicate of a step that took it, another chain's step while the fence's holder
        still holds it (its ``chain_due_at`` ahead: two chains of one job, after a lease lapsed,
        never read side by side), or the job is no longer pending (the record as it was, or None)."""
        return self._update_or_old(
            Key=to_attrs({"job_id": job_id}),
            UpdateExpression="SET fence_token = :t, fence_seq = :next, chain_due_at = :due",
            ConditionExpression="begins_with(pending_shard, :p) AND (attribute_not_exists(fence_token) "
                                "OR (fence_token = :t AND fence_seq <= :seq) "
                                "OR (fence_token <> :t AND (attribute_not_exists(chain_due_at) "
                                "OR chain_due_at <= :now)))",
            ExpressionAttributeValues=to_attrs({":t": token, ":seq": seq, ":next": seq + 1, ":now": now,
                                                ":due": now + hold, ":p": PENDING_PREFIX}))

    def set_chain_due(self, job_id: str, due_at: float) -> None:
        """Where the chain next reads (kept while Redis is down, so fan-out leaves the job alone)."""
        self._conditional(self._ddb.update_item, TableName=self.table, Key=to_attrs({"job_id": job_id}),
                          UpdateExpression="SET chain_due_at = :d",
                          ConditionExpression="begins_with(pending_shard, :p)",
                          ExpressionAttributeValues=to_attrs({":d": due_at, ":p": PENDING_PREFIX}))

    def put_observation(self, profile: str, job_id: str, lower: float, upper: float | None, at: float) -> None:
        """Record a completion-time interval (ages in seconds; upper None: never seen finished) in
        the profile's slot for this job."""
        slot = stats_slot(job_id)
        self._ddb.update_item(
            TableName=self.table, Key=to_attrs({"job_id": STATS_PREFIX + profile}),
            UpdateExpression="SET #o = :o, updated_at = :at",
            ExpressionAttributeNames={"#o": f"o{slot:03d}"},
            ExpressionAttributeValues=to_attrs({":o": {"l": round(lower, 3), "u": None if upper is None else
                                                       round(upper, 3), "t": round(at)},
                                                ":at": int(at)}))

    # -- reads --------------------------------------------------------------------------------
    def get(self, job_id: str) -> dict[str, Any] | None:
        reply = self._ddb.get_item(TableName=self.table, Key=to_attrs({"job_id": job_id}), ConsistentRead=True)
        item = reply.get("Item")
        return from_item(item) if item else None

    def get_many(self, job_ids: list[str], fields: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        """The records of those ids that exist (BatchGetItem, 100 keys per call, strongly consistent);
        only ``fields`` of each (and its id) when given."""
        found: dict[str, dict[str, Any]] = {}
        ids = list(dict.fromkeys(job_ids))
        projection: dict[str, Any] = {}
        if fields is not None:
            names = {f"#f{i}": f for i, f in enumerate(dict.fromkeys(["job_id", *fields]))}
            projection = {"ProjectionExpression": ", ".join(names), "ExpressionAttributeNames": names}
        for start in range(0, len(ids), 100):
            request: dict[str, Any] = {self.table: {"Keys": [to_attrs({"job_id": j}) for j in ids[start:start + 100]],
                                                    "ConsistentRead": True, **projection}}
            while request:
                reply = self._ddb.batch_get_item(RequestItems=request)
                for item in reply.get("Responses", {}).get(self.table, []):
                    record = from_item(item)
                    found[record["job_id"]] = record
                request = reply.get("UnprocessedKeys") or {}
        return found

    def observations(self, profile: str) -> list[dict[str, float]]:
        """The profile's recorded completion-time intervals: ``{"l", "u", "t"}`` each."""
        record = self.get(STATS_PREFIX + profile) or {}
        return [v for k, v in sorted(record.items()) if k.startswith("o") and isinstance(v, dict)]

    def note_key(self, key_id: str) -> None:
        """Remember that jobs of Sume key ``key_id`` were recorded (one string set, ``#keys``): fan-out
        keeps reading a key's partitions while it has jobs there, even after the key is removed."""
        self._ddb.update_item(TableName=self.table, Key=to_attrs({"job_id": KEYS_ITEM}),
                              UpdateExpression="ADD ids :k", ExpressionAttributeValues={":k": {"SS": [key_id]}})

    def known_keys(self) -> set[str]:
        """Every key :meth:`note_key` remembered."""
        return {str(k) for k in (self.get(KEYS_ITEM) or {}).get("ids", ())}

    def count(self, shard: str) -> int:
        """How many records one partition of the index holds (Select COUNT: no items read)."""
        return self._count("pending_shard = :p", {":p": shard})

    def pending_page(self, shard: str, start_key: dict[str, Any] | None,
                     limit: int = 100) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """One page of the sparse pending index for one partition: each record's :data:`PAGE_FIELDS`
        (not its partition, which the caller names)."""
        kwargs: dict[str, Any] = {"TableName": self.table, "IndexName": "pending",
                                  "KeyConditionExpression": "pending_shard = :p",
                                  "ProjectionExpression": ", ".join(PAGE_FIELDS),
                                  "ExpressionAttributeValues": to_attrs({":p": shard}), "Limit": limit}
        if start_key:
            kwargs["ExclusiveStartKey"] = start_key
        reply = self._ddb.query(**kwargs)
        return [from_item(i) for i in reply.get("Items", [])], reply.get("LastEvaluatedKey")

    # -- the create queue (sume_poller.store.submissions) ---------------------------------------------
    def submission(self, key_id: str, idempotency_key: str) -> dict[str, Any] | None:
        """The submission record of one idempotency key of one Sume key (strongly consistent)."""
        return self.get(submission_id(key_id, idempotency_key))

    def enqueue(self, item: dict[str, Any], submission: dict[str, Any], unknown_creates: int | None = None) -> bool:
        """Queue a submission: its queue item and its record in one TransactWriteItems, the item
        conditional on not existing, the record on not existing - or, where creates of it were sent
        before (``unknown_creates``: the count a read of its attempt record found, carried into the
        record), on still being that attempt record with that count. False: a record of that
        idempotency key exists or changed (a concurrent duplicate won, or an attempt was noted
        meanwhile; nothing was written)."""
        record, record_condition = dict(submission), "attribute_not_exists(job_id)"
        extra: dict[str, Any] = {}
        if unknown_creates is not None:
            record[UNKNOWN_CREATES] = unknown_creates
            record_condition = f"attribute_not_exists(#s) AND {UNKNOWN_CREATES} = :n"
            extra = {"ExpressionAttributeNames": {"#s": "status"},
                     "ExpressionAttributeValues": to_attrs({":n": unknown_creates})}
        puts = [{"Put": {"TableName": self.table, "Item": to_attrs(item),
                         "ConditionExpression": "attribute_not_exists(job_id)"}},
                {"Put": {"TableName": self.table, "Item": to_attrs(record), "ConditionExpression": record_condition,
                         **extra}}]
        try:
            self._ddb.transact_write_items(TransactItems=puts)
        except Exception as exc:
            if error_code(exc) != "TransactionCanceledException":
                raise
            reasons = getattr(exc, "response", {}).get("CancellationReasons") or []
            if reasons and not any(r.get("Code") == "ConditionalCheckFailed" for r in reasons):
                raise  # cancelled for another reason (a conflict with a transaction in flight): retry
            return False
        return True

    def put_submission(self, record: dict[str, Any]) -> bool:
        """Write a submission record created or rejected at once, over none, an attempt record or a
        queued one (the queue item of a concurrent duplicate then finds it settled). False: already
        settled."""
        return self._conditional(self._ddb.put_item, TableName=self.table, Item=to_attrs(record),
                                 ConditionExpression="attribute_not_exists(#s) OR #s = :q",
                                 ExpressionAttributeNames={"#s": "status"},
                                 ExpressionAttributeValues=to_attrs({":q": QUEUED}))

    def note_create(self, key_id: str, idempotency_key: str, queue_item: str | None, *, now: float) -> bool:
        """Before a create is sent: count it on the submission record (``unknown_creates`` + 1, and
        ``create_attempts`` + 1), so a crash or a timeout after sending leaves the evidence that
        Sume may have created it. ``queue_item``: the drain's create of that queued head (the record
        must still be queued by it); None: submit's create, over no record (an *attempt record*,
        without a status, is written), an attempt record or a queued one. False: the submission was
        settled meanwhile (nothing is sent)."""
        if queue_item is None:
            condition, values = "attribute_not_exists(#s) OR #s = :q", {":q": QUEUED}
        else:
            condition, values = "#s = :q AND queue_item = :item", {":q": QUEUED, ":item": queue_item}
        return self._conditional(
            self._ddb.update_item, TableName=self.table,
            Key=to_attrs({"job_id": submission_id(key_id, idempotency_key)}),
            UpdateExpression=f"ADD {UNKNOWN_CREATES} :one, create_attempts :one SET last_create_at = :now",
            ConditionExpression=condition, ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues=to_attrs({**values, ":one": 1, ":now": round(now, 3)}))

    def create_answered(self, key_id: str, idempotency_key: str) -> None:
        """A create counted by :meth:`note_create` was answered without creating anything (a 429, the
        key's refusal): it is known again (``unknown_creates`` - 1, while the record is not settled)."""
        self._conditional(
            self._ddb.update_item, TableName=self.table,
            Key=to_attrs({"job_id": submission_id(key_id, idempotency_key)}),
            UpdateExpression=f"ADD {UNKNOWN_CREATES} :minus",
            ConditionExpression=f"(attribute_not_exists(#s) OR #s = :q) AND {UNKNOWN_CREATES} > :zero",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues=to_attrs({":q": QUEUED, ":minus": -1, ":zero": 0}))

    def settle_submission(self, key_id: str, idempotency_key: str, queue_item: str, values: dict[str, Any]) -> bool:
        """A queued submission is created or rejected: set ``values`` (status among them) while
        the record is still queued by ``queue_item``. False: it was settled already."""
        present = {k: v for k, v in values.items() if v is not None}
        names = {f"#a{i}": k for i, k in enumerate(present)} | {"#s": "status"}
        attrs = to_attrs({f":v{i}": v for i, v in enumerate(present.values())} | {":q": QUEUED, ":item": queue_item})
        return self._conditional(
            self._ddb.update_item, TableName=self.table,
            Key=to_attrs({"job_id": submission_id(key_id, idempotency_key)}),
            UpdateExpression="SET " + ", ".join(f"#a{i} = :v{i}" for i in range(len(present))),
            ConditionExpression="#s = :q AND queue_item = :item", ExpressionAttributeNames=names,
            ExpressionAttributeValues=attrs)

    def queue_head(self, key_id: str, limit: int = 1, after: str | None = None) -> list[str]:
        """The ids of a key's first ``limit`` queued submissions in arrival order (after ``after``):
        one Query of the index (eventually consistent: a deleted item may still show)."""
        condition, values = "pending_shard = :p", {":p": queue_shard(key_id)}
        if after is not None:
            condition, values = condition + " AND job_id > :a", {**values, ":a": after}
        reply = self._ddb.query(TableName=self.table, IndexName="pending", KeyConditionExpression=condition,
                                ExpressionAttributeValues=to_attrs(values), Limit=limit)
        return [str(from_item(i)["job_id"]) for i in reply.get("Items", [])]

    def queue_ahead(self, key_id: str, item_id: str) -> int:
        """How many of a key's queued submissions arrived before ``item_id`` (Select COUNT)."""
        return self._count("pending_shard = :p AND job_id < :i", {":p": queue_shard(key_id), ":i": item_id})

    def _count(self, condition: str, values: dict[str, Any]) -> int:
        """Items of the pending index that meet ``condition``, every page counted (Select COUNT: no items read)."""
        kwargs: dict[str, Any] = {"TableName": self.table, "IndexName": "pending", "Select": "COUNT",
                                  "KeyConditionExpression": condition, "ExpressionAttributeValues": to_attrs(values)}
        total = 0
        while True:
            reply = self._ddb.query(**kwargs)
            total += int(reply.get("Count", 0))
            if not reply.get("LastEvaluatedKey"):
                return total
            kwargs["ExclusiveStartKey"] = reply["LastEvaluatedKey"]

    def dequeue(self, item_id: str) -> bool:
        """The queued submission is settled: its item leaves the queue (already gone is fine). True:
        this call removed it (``ReturnValues`` ALL_OLD: the item as it was), the one call that does."""
        reply = self._ddb.delete_item(TableName=self.table, Key=to_attrs({"job_id": item_id}), ReturnValues="ALL_OLD")
        return bool(reply.get("Attributes"))

    # -- helpers ------------------------------------------------------------------------------
    def _update_or_old(self, **kwargs: Any) -> TerminalWrite:
        """A conditional UpdateItem: won (with ALL_NEW attributes when asked), or lost with the
        item as it was (``ReturnValuesOnConditionCheckFailure``), without a second read."""
        try:
            reply = self._ddb.update_item(TableName=self.table, ReturnValuesOnConditionCheckFailure="ALL_OLD",
                                          **kwargs)
        except Exception as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            old = getattr(exc, "response", {}).get("Item")
            return TerminalWrite(False, from_item(old) if old else None)
        attributes = reply.get("Attributes")
        return TerminalWrite(True, from_item(attributes) if attributes else None)

    @staticmethod
    def _conditional(call: Any, **kwargs: Any) -> bool:
        try:
            call(**kwargs)
        except Exception as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True
