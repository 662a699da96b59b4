"""Run the template's functions locally without Docker, against real parts.

:class:`LocalSystem` provisions the template's own DynamoDB table and SQS queues in an AWS
endpoint over HTTP (moto server), stores the Sume key in SSM as a SecureString, routes the
terminal events of the default bus into a sink queue (so they can be counted), then imports each
function's handler from ``template.yaml`` with the environment the template gives it and
invokes it in-process. :meth:`LocalSystem.pump` plays Lambda's SQS event source mapping:
receive a batch, invoke the poll function, delete what succeeded, leave (or fast-retry) the
reported failures - honouring ``DelaySeconds`` and the redrive policy of the real queue.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import urllib3

from tools.local_invoke import make_context, prepare_environment
from tools.template import Resolver, function_spec, functions, load_template, provision

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
API_KEY_NAME = "/sume-poller/api-key"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION}


@dataclass
class PumpStats:
    batches: int = 0
    records: int = 0
    failures: int = 0
    duplicates_delivered: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


class LocalSystem:
    """The deployed shape of template.yaml, locally: real handlers, real Redis, AWS over HTTP."""

    def __init__(self, endpoint_url: str, redis_url: str, sume_base_url: str, *, api_key: str,
                 env_overrides: Mapping[str, str] | None = None,
                 template_path: Path = ROOT / "template.yaml") -> None:
        self.endpoint_url = endpoint_url
        self.sume_base_url = sume_base_url
        self._http = urllib3.PoolManager()
        self.template = load_template(template_path)
        self.resolver = Resolver(self.template, parameters={
            "SumeBaseUrl": sume_base_url, "RedisUrl": redis_url, "SumeApiKeyName": API_KEY_NAME,
        }, region=REGION)
        session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                        region_name=REGION)
        self.sqs = session.client("sqs", endpoint_url=endpoint_url)
        self.ddb = session.client("dynamodb", endpoint_url=endpoint_url)
        self.ssm = session.client("ssm", endpoint_url=endpoint_url)
        self.events = session.client("events", endpoint_url=endpoint_url)
        self._api_key = api_key
        self._provision()
        self.specs = {lid: function_spec(self.template, lid, self.resolver)
                      for lid in functions(self.template)}
        # Every function shares Globals' environment; set it once for this process.
        env = prepare_environment(self.specs["PollFunction"], base={})
        env.update(CREDENTIALS)
        env["AWS_ENDPOINT_URL"] = endpoint_url
        self._overrides = dict(env_overrides or {})
        env.update(self._overrides)
        os.environ.update(env)
        for spec in self.specs.values():  # what /opt/python is in Lambda
            for layer in spec.layer_dirs:
                if str(layer) not in sys.path:
                    sys.path.insert(0, str(layer))
        self.modules = {lid: self._load_handler(lid) for lid in self.specs}
        from sume_poller import runtime
        runtime.reset()
        self.stats = PumpStats()
        #: Every poll message body delivered so far (tests read the chains from it).
        self.seen_bodies: list[str] = []

    # -- setup -----------------------------------------------------------------------------
    def _provision(self) -> None:
        self.physical = provision(self.template, self.resolver, self.endpoint_url, REGION)
        self.ssm.put_parameter(Name=API_KEY_NAME, Value=self._api_key, Type="SecureString", Overwrite=True)
        self.queue_url = self.physical["PollQueue"]
        self.dlq_url = self.physical["PollDeadLetterQueue"]
        self.table = self.physical["JobsTable"]
        self.sink_url = self._event_sink()

    def fresh(self) -> None:
        """Start over on empty AWS state: reset moto, provision the template's resources again,
        point the functions at them (tests call this between cases)."""
        self._http.request("POST", f"{self.endpoint_url}/moto-api/reset")
        self._provision()
        for lid in self.specs:
            self.specs[lid] = function_spec(self.template, lid, self.resolver)
        os.environ.update({**self.specs["PollFunction"].environment, **self._overrides})
        from sume_poller import runtime
        runtime.reset()
        self.stats = PumpStats()
        self.seen_bodies.clear()

    def record(self, job_id: str, kind: str = "image", deadline_at: int = 4_102_444_800) -> None:
        """Record a pending job directly (as submit would, but without queueing its first poll)."""
        from sume_poller import runtime
        if not runtime.job_store().put_pending(job_id, kind, deadline_at, runtime.settings().pending_shards):
            raise ValueError(f"{job_id} is already recorded")

    def _event_sink(self) -> str:
        """An SQS queue fed by an EventBridge rule for this project's terminal events."""
        name = f"sume-poller-events-sink-{uuid.uuid4().hex[:6]}"
        url = self.sqs.create_queue(QueueName=name)["QueueUrl"]
        attrs = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
        arn = attrs["QueueArn"]
        rule = f"{name}-rule"
        self.events.put_rule(Name=rule, EventPattern=json.dumps({"source": ["sume.poller"]}))
        self.events.put_targets(Rule=rule, Targets=[{"Id": "sink", "Arn": arn}])
        return url

    def _load_handler(self, logical_id: str) -> ModuleType:
        spec = self.specs[logical_id]
        module_name, _ = spec.handler.rsplit(".", 1)
        path = spec.code_dir / f"{module_name.replace('.', '/')}.py"
        loader = importlib.util.spec_from_file_location(f"_handler_{logical_id}", path)
        assert loader is not None and loader.loader is not None
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        return module

    # -- invoking ----------------------------------------------------------------------------
    def invoke(self, logical_id: str, event: Any) -> Any:
        spec = self.specs[logical_id]
        handler_name = spec.handler.rsplit(".", 1)[1]
        handler: Callable[[Any, Any], Any] = getattr(self.modules[logical_id], handler_name)
        return handler(event, make_context(spec))

    def submit(self, kind: str, params: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        reply: dict[str, Any] = self.invoke("SubmitFunction", {"kind": kind, "params": params or {}, **extra})
        return reply

    def fanout(self) -> dict[str, Any]:
        reply: dict[str, Any] = self.invoke("FanOutFunction", {"source": "aws.events",
                                                                "detail-type": "Scheduled Event"})
        return reply

    @staticmethod
    def sqs_record(message: Mapping[str, Any], queue_arn: str = "arn:aws:sqs:us-east-1:123456789012:poll"
                   ) -> dict[str, Any]:
        """A received SQS message in the shape Lambda's event source mapping delivers it."""
        return {
            "messageId": message["MessageId"],
            "receiptHandle": message["ReceiptHandle"],
            "body": message["Body"],
            "attributes": dict(message.get("Attributes", {})),
            "messageAttributes": {},
            "md5OfBody": message.get("MD5OfBody", ""),
            "eventSource": "aws:sqs",
            "eventSourceARN": queue_arn,
            "awsRegion": REGION,
        }

    def receive(self, max_messages: int = 10, wait_seconds: int = 1) -> list[dict[str, Any]]:
        reply = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=max_messages,
                                         WaitTimeSeconds=wait_seconds, AttributeNames=["All"])
        return list(reply.get("Messages", []))

    def deliver(self, messages: list[dict[str, Any]], *, duplicate: bool = False,
                fast_retry: bool = True, poller: Any = None) -> dict[str, Any]:
        """Invoke the poll function with these messages; delete successes like the ESM does.

        ``poller``: a :class:`sume_poller.poller.Poller` to run the batch with instead of the
        handler's own (tests use one with other settings or a fault-injection checkpoint).
        """
        records = [self.sqs_record(m) for m in messages]
        self.seen_bodies.extend(m["Body"] for m in messages)
        if duplicate:  # at-least-once delivery: the same message twice in one batch
            records += [{**r, "messageId": r["messageId"] + "-dup"} for r in records]
            self.stats.duplicates_delivered += len(messages)
        if poller is None:
            reply: dict[str, Any] = self.invoke("PollFunction", {"Records": records})
        else:
            from sume_poller.poller import handle_batch
            reply = handle_batch({"Records": records}, make_context(self.specs["PollFunction"])
                                 .get_remaining_time_in_millis, poller)
        failed = {f["itemIdentifier"].removesuffix("-dup") for f in reply.get("batchItemFailures", [])}
        self.stats.batches += 1
        self.stats.records += len(records)
        self.stats.failures += len(failed)
        ok = [m for m in messages if m["MessageId"] not in failed]
        for start in range(0, len(ok), 10):
            chunk = ok[start:start + 10]
            self.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(chunk)])
        if fast_retry:  # do not wait out the visibility timeout for failed records
            for m in messages:
                if m["MessageId"] in failed:
                    self.sqs.change_message_visibility(QueueUrl=self.queue_url,
                                                       ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
        return reply

    def pump(self, *, batch_size: int = 10, wait_seconds: int = 1, duplicate: bool = False,
             fast_retry: bool = True, poller: Any = None) -> int:
        """One event-source cycle: receive up to ``batch_size`` messages and deliver them."""
        messages = self.receive(batch_size, wait_seconds)
        if messages:
            self.deliver(messages, duplicate=duplicate, fast_retry=fast_retry, poller=poller)
        return len(messages)

    def poller(self, checkpoint: Any = None, **settings: Any) -> Any:
        """A Poller on this system's real clients, with changed settings and/or a checkpoint."""
        import dataclasses

        from sume_poller import runtime
        from sume_poller.poller import Poller
        return Poller(dataclasses.replace(runtime.settings(), **settings), runtime.lease_store(),
                      runtime.sume_client(), runtime.job_store(), runtime.poll_queue(), runtime.event_bus(),
                      checkpoint=checkpoint)

    def send(self, body: str, delay: int = 0) -> None:
        self.sqs.send_message(QueueUrl=self.queue_url, MessageBody=body, DelaySeconds=delay)

    def run_until(self, done: Callable[[], bool], *, timeout: float, fanout_every: float | None = None,
                  duplicate: bool = False, on_cycle: Callable[[], None] | None = None,
                  poller: Any = None) -> None:
        """Pump (and tick fan-out) until ``done()`` or raise TimeoutError at the deadline."""
        deadline = time.monotonic() + timeout
        next_fanout = time.monotonic() + (fanout_every or 0)
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"not done after {timeout:.0f} s; {self.pending_count()} jobs pending")
            if fanout_every is not None and time.monotonic() >= next_fanout:
                self.fanout()
                next_fanout = time.monotonic() + fanout_every
            self.pump(duplicate=duplicate, poller=poller)
            if on_cycle:
                on_cycle()

    # -- reading state ---------------------------------------------------------------------------
    def jobs(self, job_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        from sume_poller.aws import from_item
        ids = list(dict.fromkeys(job_ids))
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(ids), 100):
            keys = [{"job_id": {"S": j}} for j in ids[start:start + 100]]
            request: dict[str, Any] = {self.table: {"Keys": keys, "ConsistentRead": True}}
            while request:
                reply = self.ddb.batch_get_item(RequestItems=request)
                for item in reply["Responses"].get(self.table, []):
                    record = from_item(item)
                    found[record["job_id"]] = record
                request = reply.get("UnprocessedKeys") or {}
        return found

    def all_terminal(self, job_ids: Iterable[str]) -> bool:
        ids = list(job_ids)
        records = self.jobs(ids)
        return len(records) == len(ids) and all("pending_shard" not in r for r in records.values())

    def pending_count(self) -> int:
        reply = self.ddb.scan(TableName=self.table, Select="COUNT",
                              FilterExpression="attribute_exists(pending_shard)")
        return int(reply["Count"])

    def drain_events(self) -> list[dict[str, Any]]:
        """Every terminal event delivered to the sink since the last call (event details)."""
        events: list[dict[str, Any]] = []
        while True:
            reply = self.sqs.receive_message(QueueUrl=self.sink_url, MaxNumberOfMessages=10,
                                             WaitTimeSeconds=0)
            messages = reply.get("Messages", [])
            if not messages:
                return events
            for m in messages:
                events.append(json.loads(m["Body"])["detail"])
            self.sqs.delete_message_batch(QueueUrl=self.sink_url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)])

    def queue_depth(self, url: str | None = None) -> int:
        attrs = self.sqs.get_queue_attributes(QueueUrl=url or self.queue_url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed"])["Attributes"]
        return sum(int(v) for v in attrs.values())

    # -- the simulator's control API ---------------------------------------------------------------
    def _control(self, method: str, path: str, body: Any = None) -> Any:
        root = self.sume_base_url.rsplit("/api/v1", 1)[0]
        reply = self._http.request(method, f"{root}/_sim{path}",
                                   body=None if body is None else json.dumps(body).encode(),
                                   headers={"Content-Type": "application/json"})
        if reply.status >= 400:
            raise RuntimeError(f"simulator {method} {path}: {reply.status} {reply.data[:200]!r}")
        return json.loads(reply.data)

    def sim_stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._control("GET", "/stats")
        return result

    def sim_job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._control("GET", f"/jobs/{job_id}")
        return result

    def sim_config(self, **changes: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._control("POST", "/config", changes)
        return result

    def sim_seed(self, kind: str, sim: dict[str, Any] | None = None, job_id: str | None = None) -> str:
        body: dict[str, Any] = {"kind": kind, "sim": sim or {}}
        if job_id:
            body["id"] = job_id
        return str(self._control("POST", "/jobs", body)["id"])

    def sim_reset(self) -> None:
        self._control("POST", "/reset", {})


class HandlersBackend:
    """The demo's in-process backend: handlers on moto server, this process as event source."""

    name = "handlers in-process, moto server"

    def __init__(self, system: LocalSystem, sim: Any, fanout_every: float = 10.0) -> None:
        self.system = system
        self.sim = sim
        self._events: list[dict[str, Any]] = []
        self._fanout_every = fanout_every
        self._next_fanout = time.monotonic() + fanout_every

    @classmethod
    def start(cls, stack: Any, *, time_scale: float) -> HandlersBackend:
        import subprocess

        from tools.services import MotoServer, RedisServer
        from tools.sume_sim import SumeSimulator

        subprocess.run([str(ROOT / "scripts" / "ensure-redis.sh")], check=True)
        key = "sume_demo_" + uuid.uuid4().hex
        redis_server = stack.enter_context(RedisServer())
        moto = stack.enter_context(MotoServer())
        sim = stack.enter_context(SumeSimulator(api_key=key, hints=True, time_scale=time_scale))
        log_dir = ROOT / ".scratch"
        log_dir.mkdir(exist_ok=True)
        system = LocalSystem(moto.endpoint_url, redis_server.url, sim.base_url, api_key=key, env_overrides={
            "POWERTOOLS_METRICS_DISABLED": "true", "LEASE_MARGIN_SECONDS": "5"})
        from sume_poller.observability import logger
        log_file = stack.enter_context(open(log_dir / "demo-handlers.log", "a"))  # noqa: SIM115
        for handler in logger.handlers:
            if hasattr(handler, "setStream"):
                handler.setStream(log_file)
        return cls(system, sim)

    def submit(self, event: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = self.system.invoke("SubmitFunction", event)
        return reply

    def tick(self) -> None:
        if time.monotonic() >= self._next_fanout:
            self.system.fanout()
            self._next_fanout = time.monotonic() + self._fanout_every
        for _ in range(20):
            if not self.system.pump(wait_seconds=0):
                break

    def records(self) -> list[dict[str, Any]]:
        from sume_poller.aws import from_item
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"TableName": self.system.table,
                                  "ProjectionExpression": "job_id, #s", "ExpressionAttributeNames": {"#s": "status"}}
        while True:
            reply = self.system.ddb.scan(**kwargs)
            items.extend(from_item(i) for i in reply.get("Items", []))
            if not reply.get("LastEvaluatedKey"):
                return items
            kwargs["ExclusiveStartKey"] = reply["LastEvaluatedKey"]

    def events(self) -> list[dict[str, Any]]:
        self._events.extend(self.system.drain_events())
        return list(self._events)

    def dlq_depth(self) -> int:
        return self.system.queue_depth(self.system.dlq_url)

    def counters(self) -> dict[str, int]:
        from sume_poller.poller import OUTCOME_TOTALS as t
        return {"requeues": t["requeued"] + t["transient"] + t["result_not_ready"] + t["hopped"],
                "contention": t["contention"]}

    def sim_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.sim.stats()
        return stats
