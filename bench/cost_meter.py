"""Counting what an in-process run bills (the cost figure): every AWS call, Redis command and Sume
request a handler makes, per Lambda invocation and per poll message, in AWS's billing units.

How each is counted:

* **AWS** - botocore's event hooks (``before-parameter-build``, which sees the call's parameters, and
  ``after-call``, its reply, sharing the call's context) on every client a
  boto3 Session builds while the meter is on; only calls made while a handler runs count (the bench's
  own clients, and Lambda's SQS event source played by the stack, are priced by the figure's model).
  Units as AWS bills them: SQS requests per 64 KB chunk of a send's payload, EventBridge events per
  64 KB entry, S3 PUT/GET classes and bytes put, DynamoDB read and write request units from the
  item sizes *as stored* - each write's item is read before and after it (a consistent GetItem on a
  client of the meter's own, not counted) so a write is billed by the larger of the two and its GSI
  writes by what the sparse ``pending`` index held before and after (a put, a delete, both when its
  key changed, one when a projected attribute changed).
* **Redis** - commands and round trips through redis-py (``Redis.execute_command``, one command a
  round trip; ``Pipeline.execute``, its stack in one); the server's own ``commandstats`` (Lua's
  inner commands included) are read by the figure beside them.
* **Sume** - requests to the simulator's port through urllib3.

A poll invocation processes its messages on worker threads (``BatchRunner._one``): each message's
calls and CPU time are kept apart, so the figure can model one invocation per message (Lambda's
event source at these rates) and the critical path of a batch.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

#: DynamoDB bills writes per 1 KB, reads per 4 KB, SQS and EventBridge per 64 KB chunk.
KB = 1024
CHUNK = 64 * KB
#: The jobs table's keys and its sparse GSI ``pending`` (template.yaml): what an index item holds.
TABLE_KEY = "job_id"
INDEX_KEY = "pending_shard"
INDEX_ATTRIBUTES = (TABLE_KEY, INDEX_KEY, "kind", "profile", "deadline_at", "submitted_at", "chain_due_at")
#: S3 request classes (its pricing page: PUT, COPY, POST, LIST / GET, SELECT and all others); DELETE is free.
S3_PUT_CLASS = {"PutObject", "CopyObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload",
                "PutObjectTagging", "ListObjects", "ListObjectsV2", "ListObjectVersions"}
S3_FREE = {"DeleteObject", "DeleteObjects", "AbortMultipartUpload", "DeleteObjectTagging"}


def attribute_size(name: str, value: dict[str, Any]) -> int:
    """Bytes DynamoDB counts for one attribute (name plus value), by its documented rules: strings
    and binary their UTF-8 length, a number about one byte per two digits plus one, booleans and
    null one byte, lists and maps 3 bytes plus their elements (a map's element names too), sets
    their elements. (The rules are in the developer guide's "Item sizes and formats"; no library
    computes them for a low-level item, so they are written out here.)"""
    return len(name.encode()) + _value_size(value)


def _value_size(value: dict[str, Any]) -> int:
    (kind, raw), = value.items()
    if kind == "S":
        return len(str(raw).encode())
    if kind == "B":
        return len(raw)
    if kind == "N":
        return _number_size(str(raw))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "L":
        return 3 + sum(1 + _value_size(v) for v in raw)
    if kind == "M":
        return 3 + sum(1 + attribute_size(k, v) for k, v in raw.items())
    if kind == "SS":
        return sum(len(s.encode()) for s in raw)
    if kind == "NS":
        return sum(_number_size(n) for n in raw)
    if kind == "BS":
        return sum(len(b) for b in raw)
    raise ValueError(f"unknown DynamoDB type {kind}")


def _number_size(text: str) -> int:
    digits = Decimal(text).normalize().as_tuple().digits
    return math.ceil(len(digits) / 2) + 1


def item_size(item: dict[str, Any] | None) -> int:
    return sum(attribute_size(k, v) for k, v in (item or {}).items())


def index_view(item: dict[str, Any] | None) -> tuple[str | None, dict[str, Any]]:
    """(index key, the projected item) of a table item in the sparse GSI; key None: not in it."""
    if not item or INDEX_KEY not in item:
        return None, {}
    return str(item[INDEX_KEY].get("S")), {k: item[k] for k in INDEX_ATTRIBUTES if k in item}


def write_units(before: dict[str, Any] | None, after: dict[str, Any] | None, *, failed: bool = False,
                transactional: bool = False) -> tuple[float, float]:
    """(table WRU, GSI WRU) of one write that turned ``before`` into ``after``."""
    table = max(1, math.ceil(max(item_size(before), item_size(after)) / KB))
    if failed:  # a condition that failed still reads the item it checked: billed as its write
        return float(table * (2 if transactional else 1)), 0.0
    old_key, old = index_view(before)
    new_key, new = index_view(after)
    index = 0
    if old_key is not None and (new_key != old_key):
        index += max(1, math.ceil(item_size(old) / KB))  # removed from the index (or moved: delete + put)
    if new_key is not None and (new_key != old_key or new != old):
        index += max(1, math.ceil(item_size(new) / KB))
    factor = 2 if transactional else 1
    return float(table * factor), float(index * factor)


def read_units(total_bytes: int, consistent: bool) -> float:
    """RRU of a read of ``total_bytes`` (a Query or Scan sums its items before rounding; GetItem per item;
    a read that finds nothing still costs one unit)."""
    return max(1, math.ceil(total_bytes / (4 * KB))) * (1.0 if consistent else 0.5)


@dataclass
class Usage:
    """One thread's part of an invocation: CPU seconds, calls per latency class, billable units."""

    cpu: float = 0.0
    io: Counter[str] = field(default_factory=Counter)
    units: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))


@dataclass
class Invocation:
    function: str
    clock_at: float
    wall: float = 0.0
    main: Usage = field(default_factory=Usage)
    #: A poll invocation's messages (one Usage each), then any other thread (fan-out's sender).
    messages: list[Usage] = field(default_factory=list)
    others: dict[int, Usage] = field(default_factory=dict)
    log_bytes: int = 0
    log_lines: int = 0
    emf: list[str] = field(default_factory=list)
    thread: int = field(default_factory=threading.get_ident)

    def usages(self) -> Iterator[Usage]:
        yield self.main
        yield from self.messages
        yield from self.others.values()

    def units(self) -> defaultdict[str, float]:
        total: defaultdict[str, float] = defaultdict(float)
        for usage in self.usages():
            for name, value in usage.units.items():
                total[name] += value
        return total

    def io(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for usage in self.usages():
            total.update(usage.io)
        return total

    def cpu(self) -> float:
        return sum(u.cpu for u in self.usages())


class Meter:
    """Installs the counters (``with meter.installed(sim_port):``) and collects :class:`Invocation` s;
    ``invoking(function, clock_at)`` wraps one handler call."""

    def __init__(self, side_dynamodb: Any, table: str) -> None:
        self.side = side_dynamodb  # a client of the meter's own, never counted
        self.table = table
        self.invocations: list[Invocation] = []
        self.current: Invocation | None = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._items: dict[str, dict[str, Any] | None] = {}  # job_id -> the item as last seen

    # -- attribution --------------------------------------------------------------------------------
    def usage(self) -> Usage | None:
        """Where the calling thread's calls go now (None: no handler is running)."""
        invocation = self.current
        if invocation is None:
            return None
        message = getattr(self._local, "message", None)
        if message is not None:
            return message  # type: ignore[no-any-return]
        ident = threading.get_ident()
        if ident == invocation.thread:
            return invocation.main
        with self._lock:
            return invocation.others.setdefault(ident, Usage())

    @contextmanager
    def invoking(self, function: str, clock_at: float, log_size: Callable[[], int]) -> Iterator[Invocation]:
        invocation = Invocation(function, clock_at)
        size0, cpu0, wall0 = log_size(), time.thread_time(), time.perf_counter()
        self.current = invocation
        try:
            yield invocation
        finally:
            self.current = None
            invocation.wall = time.perf_counter() - wall0
            invocation.main.cpu += time.thread_time() - cpu0
            invocation.log_bytes = log_size() - size0
            self.invocations.append(invocation)

    def message(self, run: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap ``BatchRunner._one``: each message's calls and CPU on their own Usage."""
        meter = self

        def one(runner: Any, *args: Any, **kwargs: Any) -> Any:
            invocation = meter.current
            if invocation is None:
                return run(runner, *args, **kwargs)
            usage = Usage()
            with meter._lock:
                invocation.messages.append(usage)
            meter._local.message, cpu0 = usage, time.thread_time()
            try:
                return run(runner, *args, **kwargs)
            finally:
                usage.cpu += time.thread_time() - cpu0
                meter._local.message = None
        return one

    # -- installation -------------------------------------------------------------------------------
    @contextmanager
    def installed(self, sume_port: int) -> Iterator[Meter]:
        import boto3
        import redis
        import urllib3

        from sume_poller.core import aws
        from sume_poller.poll.batch import BatchRunner

        meter = self
        patches: list[tuple[Any, str, Any]] = []

        def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
            original = getattr(owner, name)
            patches.append((owner, name, original))
            setattr(owner, name, make(original))

        def client(original: Any) -> Any:
            def build(session: Any, *args: Any, **kwargs: Any) -> Any:
                built = original(session, *args, **kwargs)
                if built is not meter.side:
                    built.meta.events.register("before-parameter-build", meter._before)
                    built.meta.events.register("after-call", meter._after)
                return built
            return build

        def execute_command(original: Any) -> Any:
            def run(client: Any, *args: Any, **options: Any) -> Any:
                if not isinstance(client, redis.client.Pipeline) and (usage := meter.usage()) is not None:
                    usage.io["redis"] += 1
                    usage.units["redis_commands"] += 1
                return original(client, *args, **options)
            return run

        def pipeline_execute(original: Any) -> Any:
            def run(pipe: Any, *args: Any, **kwargs: Any) -> Any:
                if pipe.command_stack and (usage := meter.usage()) is not None:
                    usage.io["redis"] += 1
                    usage.units["redis_commands"] += len(pipe.command_stack)
                return original(pipe, *args, **kwargs)
            return run

        def urlopen(original: Any) -> Any:
            def run(pool: Any, *args: Any, **kwargs: Any) -> Any:
                if pool.port == sume_port and (usage := meter.usage()) is not None:
                    usage.io["sume"] += 1
                    usage.units["sume_requests"] += 1
                return original(pool, *args, **kwargs)
            return run

        with ExitStack() as stack:
            patch(boto3.session.Session, "client", client)
            patch(redis.Redis, "execute_command", execute_command)
            patch(redis.client.Pipeline, "execute", pipeline_execute)
            patch(urllib3.connectionpool.HTTPConnectionPool, "urlopen", urlopen)
            patch(BatchRunner, "_one", self.message)
            for owner, name, original in reversed(patches):
                stack.callback(setattr, owner, name, original)
            stack.callback(aws.reset_session)
            aws.reset_session()  # the functions' clients are built again, with the hooks
            yield self

    # -- AWS calls ----------------------------------------------------------------------------------
    def _before(self, model: Any, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if self.current is None:
            return
        context["sume_cost_params"] = params
        if model.service_model.service_name == "dynamodb":
            for key in self._written_keys(model.name, params):
                self._known(key)

    def _after(self, model: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        params = context.get("sume_cost_params")
        if params is None or (usage := self.usage()) is None:
            return
        service, op = model.service_model.service_name, model.name
        usage.io[service] += 1
        error = (parsed.get("Error") or {}).get("Code")
        units = usage.units
        units[f"calls:{service}:{op}"] += 1
        if service == "sqs":
            units["sqs_requests"] += self._sqs_requests(op, params)
            units["sqs_entries"] += len(params.get("Entries", [])) if op == "SendMessageBatch" else op == "SendMessage"
        elif service == "events" and op == "PutEvents":
            units["eventbridge_events"] += sum(max(1, math.ceil(len(str(e).encode()) / CHUNK))
                                               for e in params.get("Entries", []))
        elif service == "s3":
            if op in S3_PUT_CLASS:
                units["s3_put"] += 1
            elif op not in S3_FREE:
                units["s3_get"] += 1
            body = params.get("Body")
            if op in ("PutObject", "UploadPart") and body is not None:
                units["s3_bytes"] += len(body) if hasattr(body, "__len__") else int(params.get("ContentLength", 0))
        elif service == "ssm":
            units["ssm_calls"] += 1
            units["kms_requests"] += bool(params.get("WithDecryption"))
        elif service == "secretsmanager":
            units["secrets_calls"] += 1
        elif service == "dynamodb":
            rru, wru, gsi = self._dynamodb(op, params, parsed, error)
            units["ddb_rru"] += rru
            units["ddb_wru"] += wru
            units["ddb_gsi_wru"] += gsi

    @staticmethod
    def _sqs_requests(op: str, params: dict[str, Any]) -> int:
        if op == "SendMessage":
            return max(1, math.ceil(len(params.get("MessageBody", "").encode()) / CHUNK))
        if op == "SendMessageBatch":
            payload = sum(len(e.get("MessageBody", "").encode()) for e in params.get("Entries", []))
            return max(1, math.ceil(payload / CHUNK))
        return 1

    # -- DynamoDB units -----------------------------------------------------------------------------
    @staticmethod
    def _written_keys(op: str, params: dict[str, Any]) -> list[str]:
        if op in ("PutItem",):
            return [params["Item"][TABLE_KEY]["S"]]
        if op in ("UpdateItem", "DeleteItem"):
            return [params["Key"][TABLE_KEY]["S"]]
        if op == "TransactWriteItems":
            keys = []
            for entry in params.get("TransactItems", []):
                (kind, body), = entry.items()
                if kind != "ConditionCheck":
                    keys.append((body.get("Item") or body.get("Key"))[TABLE_KEY]["S"])
            return keys
        if op == "BatchWriteItem":
            return [(r.get("PutRequest", {}).get("Item") or r["DeleteRequest"]["Key"])[TABLE_KEY]["S"]
                    for requests in params.get("RequestItems", {}).values() for r in requests]
        return []

    def _fetch(self, key: str) -> dict[str, Any] | None:
        item: dict[str, Any] | None = self.side.get_item(TableName=self.table, Key={TABLE_KEY: {"S": key}},
                                                         ConsistentRead=True).get("Item")
        return item

    def _known(self, key: str) -> dict[str, Any] | None:
        if key not in self._items:
            self._items[key] = self._fetch(key)
        return self._items[key]

    def _dynamodb(self, op: str, params: dict[str, Any], parsed: dict[str, Any],
                  error: str | None) -> tuple[float, float, float]:
        """(RRU, table WRU, GSI WRU) of one call."""
        keys = self._written_keys(op, params)
        if keys:
            wru = gsi = 0.0
            transactional = op == "TransactWriteItems"
            failed = error in ("ConditionalCheckFailedException", "TransactionCanceledException")
            for key in keys:
                before = self._items.get(key)
                after = before if failed else self._fetch(key)
                table, index = write_units(before, after, failed=failed, transactional=transactional)
                self._items[key] = after
                wru, gsi = wru + table, gsi + index
            return 0.0, wru, gsi
        consistent = bool(params.get("ConsistentRead"))
        if op == "GetItem":
            key = params["Key"][TABLE_KEY]["S"]
            item = parsed.get("Item")
            if params.get("ProjectionExpression") and item is not None:
                item = self._known(key)
            else:
                self._items[key] = item
            return read_units(item_size(item), consistent), 0.0, 0.0
        if op == "BatchGetItem":
            rru = 0.0
            for table, request in params.get("RequestItems", {}).items():
                found = {i[TABLE_KEY]["S"]: i for i in (parsed.get("Responses") or {}).get(table, [])}
                for key in (k[TABLE_KEY]["S"] for k in request.get("Keys", [])):
                    rru += read_units(item_size(found.get(key)), bool(request.get("ConsistentRead")))
            return rru, 0.0, 0.0
        if op in ("Query", "Scan"):
            items = parsed.get("Items")
            if items is None or params.get("ProjectionExpression"):  # Select COUNT, or a projection: what was read
                read = {k: v for k, v in params.items() if k not in ("Select", "ProjectionExpression")}
                items = getattr(self.side, op.lower())(**read).get("Items", [])
            return read_units(sum(item_size(i) for i in items), consistent), 0.0, 0.0
        return 0.0, 0.0, 0.0
