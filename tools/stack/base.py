"""The local stack: one interface over two ways of running template.yaml, and what both share.

A :class:`Stack` is the whole system on this machine - Redis, the Sume simulator, the AWS resources and the
template's functions - behind one API for the demo, the tests and the benchmarks, whatever runs the functions
(:mod:`tools.stack.inprocess`, :mod:`tools.stack.deployed`). Its clock scale is one knob: the functions'
``TimeScale`` parameter and the simulator's ``time_scale``, so both sides agree on every duration, hint and budget
window. Shared here: the terminal-event sink, the job table, queue reading, Powertools' EMF metric totals.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Self, cast

from sume_poller.core.clock import Clock
from sume_poller.store.events import EVENT_DETAIL_TYPE, EVENT_SOURCE
from sume_poller.store.records import JobStore, from_item, to_attrs
from tools.template import REGION, ROOT

SCRATCH = ROOT / ".scratch" / "stack"
#: Dummy credentials: moto and ministack accept any (a non-numeric key is account 000000000000).
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION}
#: Template parameters of every local stack (on top of the template's defaults). The stack adds
#: TimeScale, RedisUrl and SumeBaseUrl; a caller's ``parameters`` win over all of them.
#: LeaseMarginSeconds 5: a lost chain is picked up a few seconds after its delay ends, not 30 s.
LOCAL_PARAMETERS = {"LocalEndpoints": "true", "SumeApiKeyName": "/sume-poller/api-key", "LeaseMarginSeconds": "5"}
KEY_CONFIG = "sume-poller/keys"  # the key configuration's secret (SumeKeysSecretName) of a stack with keys


class SetupError(RuntimeError):
    """Something ``make setup`` provides (a virtualenv, a binary) is missing."""


def require(path: Path, what: str) -> Path:
    """``path`` if it exists, else :class:`SetupError` with the one line that fixes it."""
    if not path.exists():
        raise SetupError(f"{what} missing ({path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}): "
                         "run make setup")
    return path


def prune_stale(parent: Path) -> None:
    """Remove the ``<pid>-...`` files and directories of processes that are gone (a run that was killed before it could
    clean up)."""
    for entry in parent.glob("*-*"):
        pid = entry.name.split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)


def scheduled_event() -> dict[str, Any]:
    """The event an EventBridge schedule sends."""
    return {"version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event", "source": "aws.events",
            "account": "000000000000", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "region": REGION, "resources": [], "detail": {}}


class EventSink:
    """An SQS queue fed by an EventBridge rule matching the terminal events on ``bus``."""

    def __init__(self, sqs: Any, events: Any, bus: str = "default") -> None:
        self.sqs = sqs
        name = f"sume-poller-events-sink-{uuid.uuid4().hex[:8]}"
        self.url: str = sqs.create_queue(QueueName=name)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        pattern = {"source": [EVENT_SOURCE], "detail-type": [EVENT_DETAIL_TYPE]}
        events.put_rule(Name=f"{name}-rule", EventBusName=bus, EventPattern=json.dumps(pattern))
        events.put_targets(Rule=f"{name}-rule", EventBusName=bus, Targets=[{"Id": "sink", "Arn": arn}])
        #: Terminal event details, in arrival order.
        self.received: list[dict[str, Any]] = []

    def drain(self, wait_seconds: int = 0) -> list[dict[str, Any]]:
        """Receive and delete what the sink holds now (the first receive may long-poll ``wait_seconds``); the new
        details, which are also appended to ``received``."""
        new: list[dict[str, Any]] = []
        while messages := self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10,
                                                   WaitTimeSeconds=0 if new else wait_seconds).get("Messages", []):
            new.extend(json.loads(m["Body"]).get("detail", {}) for m in messages)
            self.sqs.delete_message_batch(QueueUrl=self.url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)])
        self.received.extend(new)
        return new


class JobTable(JobStore):
    """The jobs table, read consistently and decoded to plain Python (numbers as int/float): ``get`` and ``get_many``
    are the layer's own reads; ``scan`` leaves the per-profile statistics items (keys starting with ``#``) out unless
    ``stats``."""

    def __init__(self, ddb: Any, name: str) -> None:
        super().__init__(name, 1, ddb=ddb)

    def scan(self, attributes: Iterable[str] | None = None, *, stats: bool = False) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {"TableName": self.table, "ConsistentRead": True}
        if attributes is not None:
            names = {f"#a{i}": a for i, a in enumerate(dict.fromkeys(["job_id", *attributes]))}
            kwargs.update(ProjectionExpression=", ".join(names), ExpressionAttributeNames=names)
        records = (from_item(i) for page in self._ddb.get_paginator("scan").paginate(**kwargs) for i in page["Items"])
        return [r for r in records if stats or not str(r["job_id"]).startswith("#")]

    def put(self, record: Mapping[str, Any]) -> None:
        """Write a record as it is (a test's setup: a state the functions must meet)."""
        self._ddb.put_item(TableName=self.table, Item=to_attrs(dict(record)))

    def clear(self) -> int:
        """Delete every item (records and statistics); how many."""
        keys = [{"job_id": {"S": str(r["job_id"])}} for r in self.scan([], stats=True)]
        for start in range(0, len(keys), 25):
            request: Any = {self.table: [{"DeleteRequest": {"Key": k}} for k in keys[start:start + 25]]}
            while request:
                request = self._ddb.batch_write_item(RequestItems=request).get("UnprocessedItems")
        return len(keys)


def queue_depth(sqs: Any, url: str) -> int:
    """Messages in a queue: visible, in flight and delayed."""
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed"])["Attributes"]
    return sum(int(v) for v in attrs.values())


class EmfTotals:
    """Sums of the metrics in Powertools EMF lines (one JSON document per line, ``_aws`` key). ``totals`` has an entry
    (possibly 0) for every metric name seen: a metric emitted with value 0 still counts as emitted; ``by_key``: the
    same of the lines with a ``key`` dimension, per key."""

    def __init__(self) -> None:
        self.totals: Counter[str] = Counter()
        self.by_key: dict[str, Counter[str]] = {}

    def add_line(self, line: str) -> None:
        if (start := line.find("{")) < 0 or '"_aws"' not in line:
            return
        try:
            document = json.loads(line[start:])
        except ValueError:
            return
        if not isinstance(document, dict) or not isinstance(document.get("_aws"), dict):
            return
        key = document.get("key")
        counters = [self.totals, *([self.by_key.setdefault(key, Counter())] if isinstance(key, str) else [])]
        for directive in document["_aws"].get("CloudWatchMetrics", []):
            for metric in directive.get("Metrics", []):
                value = document.get(name := metric.get("Name"))
                total = sum(v for v in (value if isinstance(value, list) else [value])
                            if isinstance(v, int | float) and not isinstance(v, bool))
                for counter in counters:  # counts are whole numbers; other units (ms...) keep their fraction
                    counter[name] += int(total) if float(total).is_integer() else cast(int, total)

    def clear(self) -> None:
        self.totals, self.by_key = Counter(), {}

    def refresh(self) -> None:
        """Add the lines that came since (here: none; they are added as they come)."""


def wait_until(condition: Callable[[], bool], timeout: float, describe: Callable[[], str],
               step: Callable[[float], None]) -> None:
    """Call ``step(seconds_left)`` until ``condition()``; TimeoutError with ``describe()`` at the deadline. ``step``
    does the waiting (a long poll, a batch of work), so this loop never sleeps by itself."""
    deadline = time.monotonic() + timeout
    while not condition():
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"not done after {timeout:g} s: {describe()}")
        step(left)


class Stack(ABC):
    """template.yaml running locally with Redis and the Sume simulator; a context manager that starts what it needs on
    enter and stops what it started on exit. ``redis_server`` may be stopped and started (an outage);
    ``client(service)`` gives boto3 clients on the stack's endpoint; ``schedules`` are the scheduled functions,
    fan-out first. ``keys``: Sume keys beside the default one (id -> the simulator's options of its key: workspace,
    default the id; read/create budgets, its limits in the key configuration too; webhook secret); ``.keys`` their
    API keys now."""

    name: str
    schedules: list[str]
    _emf: EmfTotals

    def __init__(self, time_scale: float, parameters: Mapping[str, Any] | None,
                 sim_options: Mapping[str, Any] | None, keys: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.time_scale = time_scale
        self._overrides = dict(parameters or {})
        self._sim_options = dict(sim_options or {})
        self._key_options = {k: {"workspace": k, **v} for k, v in (keys or {}).items()}

    @abstractmethod
    def _start(self, stack: ExitStack) -> None:
        """Start everything (register every stop on ``stack``)."""

    def _start_services(self, stack: ExitStack) -> None:
        """What both backends run beside the AWS side: the clock, redis-server, the Sume simulator; the template
        parameters: the local defaults, these services, then the caller's."""
        from tools.services import RedisServer
        from tools.sume_sim import SumeSimulator

        self.clock = Clock(self.time_scale)
        self.api_key = "sume_local_" + uuid.uuid4().hex
        self._initial_keys = {k: f"sume_local_{k}_{uuid.uuid4().hex}" for k in self._key_options}
        self.keys = dict(self._initial_keys)
        options = {**self._sim_options, "keys": {**{self.keys[k]: o for k, o in self._key_options.items()},
                                                 **self._sim_options.get("keys", {})} or None}
        self.redis_server = stack.enter_context(RedisServer())
        self.redis_url = self.redis_server.url
        self.sim = stack.enter_context(SumeSimulator(api_key=self.api_key, time_scale=self.time_scale, **options))
        named = {"SumeKeysSecretName": KEY_CONFIG} if self.keys else {}
        self.parameters = {**LOCAL_PARAMETERS, "TimeScale": f"{self.time_scale:g}", "RedisUrl": self.redis_url,
                           "SumeBaseUrl": self.sim.base_url, **named, **{k: str(v) for k, v in self._overrides.items()}}

    def key_config(self, *, inline: bool = False) -> dict[str, Any]:
        """The key configuration (keys.py's format 2) of ``.keys``: limits, and where each key's API key and
        webhook secret live (:meth:`key_secrets`); ``inline``: format 1, the secrets in the list itself (a
        deployed configuration from before the split, which the functions still read)."""
        from sume_poller.config.keys import API_KEYS, WEBHOOK_SECRETS

        entries: dict[str, Any] = {}
        for key_id, api_key in self.keys.items():
            options = self._key_options[key_id]  # {"read_budget": {"per_minute": 60}} -> reads_per_minute 60
            hook = options.get("webhook_secret")
            where = {"api_key": api_key, **({"webhook_secret": hook} if hook else {})} if inline else {
                "api_key_from": f"secretsmanager:{KEY_CONFIG}/{API_KEYS}/{key_id}",
                **({"webhook_secret_from": f"secretsmanager:{KEY_CONFIG}/{WEBHOOK_SECRETS}/{key_id}"} if hook else {})}
            entries[key_id] = {**where, **{f"{what}s_{window}": n for what in ("read", "create")
                                           for window, n in (options.get(f"{what}_budget") or {}).items()
                                           if n is not None}}
        return {"keys": entries}

    def key_secrets(self) -> dict[str, str]:
        """Secret name -> value of every key's API key and webhook secret, where format 2 names them."""
        from sume_poller.config.keys import API_KEYS, WEBHOOK_SECRETS

        secrets = {f"{KEY_CONFIG}/{API_KEYS}/{key_id}": api_key for key_id, api_key in self.keys.items()}
        return {**secrets, **{f"{KEY_CONFIG}/{WEBHOOK_SECRETS}/{key_id}": hook for key_id in self.keys
                              if (hook := self._key_options[key_id].get("webhook_secret"))}}

    def store_keys(self) -> None:
        """The default key's API key where the template reads it; each key's secrets, then the key list (KEY_CONFIG)."""
        self.client("ssm").put_parameter(Name=self.parameters["SumeApiKeyName"], Value=self.api_key,
                                         Type="SecureString", Overwrite=True)
        if name := self.parameters.get("SumeKeysSecretName"):
            secrets = self.client("secretsmanager")
            for secret_name, value in {**self.key_secrets(), name: json.dumps(self.key_config())}.items():
                try:
                    secrets.put_secret_value(SecretId=secret_name, SecretString=value)
                except secrets.exceptions.ResourceNotFoundException:
                    secrets.create_secret(Name=secret_name, SecretString=value)

    def _connect(self, client: Callable[[str], Any], outputs: Mapping[str, str]) -> None:
        """The AWS side is up: its clients, the stack's outputs, the job table, the event sink."""
        self.client, self.outputs = client, dict(outputs)
        self.table = JobTable(client("dynamodb"), self.outputs["JobsTableName"])
        self.sink = EventSink(client("sqs"), client("events"), self.parameters.get("EventBusName", "default"))

    def __enter__(self) -> Self:
        with ExitStack() as stack:  # a start that fails stops what it started
            self._start(stack)
            self._exit = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._exit.close()

    @abstractmethod
    def invoke(self, logical_id: str, event: Any) -> Any:
        """Invoke a function (by logical id) synchronously; its reply. A function error raises."""

    def submit(self, event: dict[str, Any]) -> dict[str, Any]:
        """Invoke the submit function with ``event``; its reply."""
        return cast(dict[str, Any], self.invoke("SubmitFunction", event))

    def fanout(self) -> dict[str, Any]:
        """Run fan-out now, as its schedule would; its report."""
        return cast(dict[str, Any], self.invoke("FanOutFunction", scheduled_event()))

    def run_schedules(self) -> dict[str, Any]:
        """Run every scheduled function once now (fan-out first, then e.g. sweeps); replies by id."""
        return {lid: self.invoke(lid, scheduled_event()) for lid in self.schedules}

    @abstractmethod
    def drive(self, until: Callable[[], bool], timeout: float, *, fanout_every: float | None = None) -> None:
        """Let the system work until ``until()`` (``fanout_every``: run the scheduled functions that often, real
        seconds); TimeoutError saying what is pending after ``timeout`` s."""

    def budget_state(self, what: str = "reads", key: str | None = None) -> dict[str, float]:
        """A key's ``what`` budget ("reads" or "creates"; ``key`` None: the default key's) as the functions keep it in
        Redis (:meth:`~sume_poller.limits.budget.Budget.state`): e.g. ``learned_minute``, the minute's limit Sume's
        ``RateLimit`` headers taught the shared limiter (absent: none taught)."""
        import redis

        from sume_poller.config.keys import Limits, SumeKey
        from sume_poller.limits.budget import Budget

        name = SumeKey(key or "default", Limits(), str, default=key is None).budget_name(
            self.parameters.get("LeaseKeyPrefix", "sume:poll:"), what)
        with redis.Redis.from_url(self.redis_url) as client:
            return Budget(client, name, 0, 0, self.clock.now).state()

    def metric_totals(self, key: str | None = None) -> Counter[str]:
        """Per metric name, the sum of the EMF lines since the start or :meth:`reset` (``key``: with its dimension)."""
        self._emf.refresh()
        return Counter(self._emf.totals if key is None else self._emf.by_key.get(key, Counter()))

    @abstractmethod
    def reset(self) -> None:
        """A clean slate between tests: no jobs, messages or events, empty Redis, simulator reset."""

    @property
    def queue_url(self) -> str:
        return self.outputs["PollQueueUrl"]

    @property
    def dlq_url(self) -> str:
        return self.outputs["PollDeadLetterQueueUrl"]

    def records(self, job_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Every job record, or those of ``job_ids`` (the ones that exist)."""
        return self.table.scan() if job_ids is None else list(self.table.get_many(list(job_ids)).values())

    def record(self, job_id: str) -> dict[str, Any] | None:
        return self.table.get(job_id)

    def events(self) -> list[dict[str, Any]]:
        """Details of every terminal event received so far (since the last :meth:`reset`)."""
        self.sink.drain()
        return list(self.sink.received)

    def queue_depth(self) -> int:
        return queue_depth(self.client("sqs"), self.queue_url)

    def dlq_depth(self) -> int:
        return queue_depth(self.client("sqs"), self.dlq_url)

    def send(self, body: str, delay_seconds: int = 0) -> None:
        """Put a message on the poll queue (as submit or fan-out would)."""
        self.client("sqs").send_message(QueueUrl=self.queue_url, MessageBody=body, DelaySeconds=delay_seconds)

    def settled(self, job_ids: Iterable[str]) -> bool:
        """Every one of ``job_ids`` is recorded terminal with its event published."""
        ids = list(job_ids)
        found = self.table.get_many(ids, ("status", "event_pending"))  # asked often: not the whole records
        return len(found) == len(set(ids)) and all(
            r.get("status") != "pending" and not r.get("event_pending") for r in found.values())

    def pending_summary(self, job_ids: Iterable[str] | None = None) -> str:
        """What is not finished, for timeout messages."""
        ids = None if job_ids is None else list(job_ids)
        records = self.records(ids)
        by = Counter(str(r.get("status")) for r in records)
        unsent = sum(1 for r in records if r.get("event_pending"))
        missing = len(set(ids)) - len(records) if ids is not None else 0
        return (f"records by status {dict(by)}, {unsent} events unpublished, {missing} not recorded, "
                f"poll queue {self.queue_depth()}, DLQ {self.dlq_depth()}")

    def _reset_services(self) -> None:
        """The shared part of :meth:`reset`: Redis emptied and the simulator reset."""
        import redis

        with redis.Redis.from_url(self.redis_url) as client:
            client.flushall()
        self.sim.reset()  # its keys as they were at the start
        self.keys = dict(self._initial_keys)
