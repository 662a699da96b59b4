"""The simulation's fakes held to the real services (tests/sim): the same operations, through the layer's own
calls, against each fake and against the real thing - redis-server, moto server over HTTP, the Sume simulator's
HTTP server - and the answers compared. What a fake does not keep, a test here would show."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
import redis
from botocore.exceptions import ClientError
from sim.dynamo_fake import DynamoWorld
from sim.miniredis import Client, Server
from sim.plan import Faults
from sim.s3_fake import S3World
from sim.scheduler import Scheduler
from sim.sqs_fake import SqsWorld
from sim.sume_fake import BASE, Transport

from sume_poller.core.aws import error_code
from sume_poller.core.clock import Clock
from sume_poller.discovery.coverage import CoverageStore
from sume_poller.discovery.deliveries import DeliveryStore
from sume_poller.limits.budget import Budget, RateInfo
from sume_poller.limits.gate import ReadGate
from sume_poller.limits.lease import ChainStep, LeaseStore
from sume_poller.limits.pacer import LocalPacer
from sume_poller.limits.redisconn import Breaker
from sume_poller.store.records import Ending, JobStore, ResultBucket
from sume_poller.store.submissions import queue_item, queued_record
from sume_poller.sume.client import SumeClient
from tools.sume_sim import SumeSimulator
from tools.template import Provisioned

pytestmark = pytest.mark.integration
NOW = 1_790_000_000.0
A, B, C = "a" * 32, "b" * 32, "c" * 32


# -- Redis: every script of the layer, the same inputs and clock on both ------------------------------------
def redis_scenario(client: Any) -> list[Any]:
    """The lease's, budget's and gate's scripts and the plain commands the layer sends, in one sequence,
    each answer kept. The clock the scripts are told is this scenario's own (``clock``)."""
    clock = [NOW + 0.25]
    now: Callable[[], float] = lambda: clock[0]  # noqa: E731
    out: list[Any] = []
    lease = LeaseStore(client, "t:")
    budget = Budget(client, "t:!budget:{reads}", 30, 1000, now, early=0.5, reserve_every=900.0)
    gate = ReadGate(lease, budget, LocalPacer(30, 1000, 2, now), cluster=False, breaker=Breaker(now=now))
    first, fresh = ChainStep(A, 0, "n1"), ChainStep(B, 0, "n2")
    out += [lease.start("j1", A, 60_000), lease.start("j1", B, 60_000), lease.start("j1", A, 60_000)]
    out += [lease.claim("j1", first, fresh, 60_000), lease.claim("j1", first, fresh, 60_000),
            lease.claim("j1", ChainStep(A, 0, "n9"), fresh, 60_000)]  # a duplicate delivery: held
    out += [lease.rest("j1", first, 90_000, slot=NOW + 30.5), lease.hand_over("j1", C, 45_000, now=NOW, margin_ms=500),
            lease.hand_over("j1", C, 45_000), lease.claim("j1", ChainStep(A, 1, "n3"), fresh, 60_000)]
    out += [lease.claim("j2", ChainStep(A, 4, "n4"), ChainStep(C, 0, "n4"), 70_000),
            lease.rest("j2", ChainStep(C, 0, "n4"), 5_000, finishing=True),
            lease.release("j2", "x:1"), lease.release("j2", f"{C}:1*"), lease.release("j2", "gone")]
    out += [lease.start_many([("j3", A), ("j4", B), ("j3", C)], 30_000), lease.held(["j3", "j4", "j5"])]
    for i, mode in enumerate(["take", "take", "ahead", "take", "list", "spare", "peek", "take", "ahead", "take"]):
        clock[0] += 0.37 * i
        grant = budget.take(mode, max_wait=math.inf if i % 3 else 4.0, count=1 + (mode == "list"))
        out.append((mode, grant))
        if grant.granted and grant.wait > 0 and mode == "take":
            out.append(("confirm", budget.take("confirm", slot=clock[0] + grant.wait)))
            out.append(("rconfirm", budget.take("rconfirm", slot=clock[0] + grant.wait + 1.5)))
    budget.open_lane(0.1, NOW + 3600)
    budget.mailbox.set_pending(7)
    budget.mailbox.set_oldest_pending(NOW - 12.5)
    budget.feedback(RateInfo(limit=30, remaining=4, reset=17.0, policy=((60, 30), (86_400, 1000))))
    budget.feedback(RateInfo(retry_after=3.0))
    budget.feedback(RateInfo(limit=1000, remaining=200, reset=40_000.0))
    out += [("after feedback", budget.take("take")), ("lane", budget.take("list", max_wait=0.0, count=3))]
    budget.pause_key(300.0)
    out.append(("paused", budget.take("take", max_wait=10.0)))
    clock[0] += 400.0
    out += [gate.enter("j6", ChainStep(A, 0, "g1"), ChainStep(B, 0, "g1"), 60_000, mode="take"),
            gate.enter("j6", ChainStep(B, 0, "g1"), ChainStep(C, 0, "g2"), 60_000, mode="take"),
            gate.enter("j6", ChainStep(A, 0, "g3"), ChainStep(C, 0, "g3"), 60_000, mode="none"),
            gate.take("ahead"), budget.state()]
    coverage = CoverageStore(client, "t:")
    coverage.found("image", "j7", NOW, submitted=NOW - 30, status="completed")
    coverage.found("image", "j8", NOW + 1.5)
    coverage.update(tick_at=NOW, healthy_until=NOW + 99.5, **{"cov:image": 3})
    out += [coverage.state(), coverage.judge({"image": {"j7"}}, NOW + 200, 60.0)]
    DeliveryStore(client, "t:").delivered("video", 42.5)
    pipe = client.pipeline(transaction=False)
    pipe.get("t:!outbox:j1")
    pipe.set("t:!outbox:j1", "1:123.500", ex=172_800)
    out.append(pipe.execute())
    out += [client.exists("t:!webhook:e1"), client.set("t:!webhook:e1", "1", ex=600), client.exists("t:!webhook:e1"),
            client.hset("t:h", mapping={"a": 1, "b": 2.5}), client.hincrby("t:h", "a", 4), client.hgetall("t:h")]
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        client.hget("t:!webhook:e1", "x")
    return out


def redis_state(keys: list[str], read: Callable[[str], tuple[str, Any, int]]) -> dict[str, Any]:
    """Every key's type, value and TTL (whole seconds, rounded up: the real server's clock runs on)."""
    return {k: read(k) for k in sorted(keys)}


def _real_key(rdb: redis.Redis, key: str) -> tuple[str, Any, int]:
    kind = rdb.type(key)
    value: Any = {"string": rdb.get, "hash": rdb.hgetall, "list": lambda k: rdb.lrange(k, 0, -1),
                  "zset": lambda k: rdb.zrange(k, 0, -1, withscores=True)}[kind](key)
    ttl = rdb.pttl(key)
    return kind, value, ttl if ttl < 0 else math.ceil(ttl / 1000)


def _mini_key(server: Server, key: str) -> tuple[str, Any, int]:
    kind, value = server.data[key]
    if kind == "zset":
        value = [(m, s) for m, s in sorted(value.items(), key=lambda item: (item[1], item[0]))]
    elif kind != "string":
        value = dict(value) if kind == "hash" else list(value)
    when = server.expires.get(key)
    return kind, value, -1 if when is None else math.ceil((when - server.now_ms()) / 1000)


def test_miniredis_answers_every_layer_script_and_command_as_redis_server_does(rdb: redis.Redis) -> None:
    real = redis_scenario(rdb)
    server = Server(lambda: NOW)
    mini = redis_scenario(Client(server))
    assert mini == real
    assert redis_state(list(server.data), lambda k: _mini_key(server, k)) == \
        redis_state(rdb.keys("*"), lambda k: _real_key(rdb, k))


def test_a_script_redis_forgot_is_loaded_again_on_both(rdb: redis.Redis) -> None:
    for client in (rdb, Client(Server(lambda: NOW))):
        lease = LeaseStore(client, "t:")
        assert lease.start("j", A, 1000)
        client.script_flush()
        assert not lease.start("j", B, 1000)  # redis-py's Script loads it again (NOSCRIPT)
        assert lease.start_many([("k", A)], 1000) == [True]  # so does the pipelined start


# -- DynamoDB: the job store's calls on the fake and on moto server (the template's table) -------------------
def dynamo_scenario(store: JobStore, ddb: Any) -> list[Any]:
    out: list[Any] = []

    def attempt(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except ClientError as exc:
            return ("error", error_code(exc))

    out += [store.put_pending(f"job_{i}", "image", now=NOW, deadline_at=int(NOW) + 600, chain_due_at=NOW + i)
            for i in range(5)]
    out.append(store.put_pending("job_1", "video", now=NOW, deadline_at=int(NOW)))
    won = store.record_terminal("job_1", Ending("completed", "succeeded", None, {"result_json": "{}"}, 2, 1,
                                                NOW + 1.5, NOW + 2.25), now=NOW + 3)
    lost = store.record_terminal("job_1", Ending("failed"), now=NOW + 4)
    out += [won, lost, store.record_terminal("job_none", Ending("failed"), now=NOW)]
    out += [store.clear_outbox("job_1", now=NOW + 5), store.clear_outbox("job_1", now=NOW + 6),
            store.fence("job_2", A, 0, now=NOW, hold=60.0), store.fence("job_2", A, 0, now=NOW, hold=60.0),
            store.fence("job_2", A, 1, now=NOW, hold=60.0), store.fence("job_2", B, 0, now=NOW + 30, hold=60.0),
            store.fence("job_2", B, 0, now=NOW + 60, hold=60.0), store.fence("job_2", A, 2, now=NOW + 61, hold=60.0),
            store.fence("job_1", A, 0, now=NOW, hold=60.0)]
    store.set_chain_due("job_3", NOW + 99.5)
    store.set_chain_due("job_1", NOW + 99.5)
    store.put_observation("image", "job_1", 1.5, 2.25, at=NOW)
    store.put_observation("image", "job_3", 0.0, None, at=NOW)
    store.note_key("acme")
    store.note_key("acme")
    store.note_key("zeta")
    out += [store.known_keys(), store.observations("image"), store.get("job_3"), store.get_many(["job_0", "job_9"])]
    for shard in (f"p{i:02d}" for i in range(store.shards)):
        out.append(store.count(shard))
        page, start = store.pending_page(shard, None, limit=2)
        out.append((page, start))
        if start:
            out.append(store.pending_page(shard, start, limit=2))
    out.append(store.pending_page("o00", None) + store.pending_page("o01", None))
    items = [queue_item("default", kind="image", params={"p": i}, idempotency_key=f"key-{i}x", derived=False,
                        arrived=NOW + i, deadline_at=NOW + 60) for i in range(3)]
    out += [store.enqueue(item, queued_record(item)) for item in items]
    out.append(store.enqueue(items[0], queued_record(items[0])))
    out += [store.queue_head("default", limit=2), store.queue_head("default", after=items[0]["job_id"]),
            store.queue_ahead("default", items[2]["job_id"])]
    out += [store.settle_submission("default", "key-0x", items[0]["job_id"], {"status": "created", "n": 1}),
            store.settle_submission("default", "key-0x", items[0]["job_id"], {"status": "rejected"}),
            store.put_submission({"job_id": "#sub:default:key-1x", "status": "created"}),
            store.put_submission({"job_id": "#sub:default:key-0x", "status": "created"})]
    out += [store.dequeue(items[0]["job_id"]), store.dequeue(items[0]["job_id"])]  # removed, then gone already
    out += [store.queue_head("default", limit=5), store.submission("default", "key-0x")]
    # creates noted before they are sent: an attempt record, queued over it with its count, settled
    late = queue_item("default", kind="image", params={"p": 9}, idempotency_key="key-9x", derived=False,
                      arrived=NOW + 9, deadline_at=NOW + 60)
    out += [store.note_create("default", "key-9x", None, now=NOW),
            store.note_create("default", "key-9x", None, now=NOW),
            store.create_answered("default", "key-9x"), store.submission("default", "key-9x"),
            store.enqueue(late, queued_record(late), unknown_creates=2),  # stale count: refused
            store.enqueue(late, queued_record(late), unknown_creates=1),
            store.note_create("default", "key-9x", "#q:other", now=NOW + 1),  # not queued by that item
            store.note_create("default", "key-9x", late["job_id"], now=NOW + 1), store.submission("default", "key-9x"),
            store.put_submission({"job_id": "#sub:default:key-9x", "status": "created"}),
            store.note_create("default", "key-9x", None, now=NOW + 2), store.create_answered("default", "key-9x"),
            store.put_submission({"job_id": "#sub:default:key-8x", "status": "rejected"}),
            store.note_create("default", "key-7x", None, now=NOW), store.create_answered("default", "key-7x"),
            store.create_answered("default", "key-7x"), store.put_submission({"job_id": "#sub:default:key-7x",
                                                                               "status": "created"}),
            store.submission("default", "key-9x"), store.submission("default", "key-7x")]
    key = {"job_id": {"S": "job_4"}}
    out += [attempt(lambda: ddb.update_item(TableName="jobs", Key=key, UpdateExpression="SET a = :a",
                                            ExpressionAttributeValues={":a": {"N": "1"}, ":b": {"N": "2"}})),
            attempt(lambda: ddb.update_item(TableName="jobs", Key=key, UpdateExpression="SET a = :a",
                                            ExpressionAttributeNames={"#x": "x"},
                                            ExpressionAttributeValues={":a": {"N": "1"}})),
            attempt(lambda: ddb.update_item(TableName="jobs", Key=key, ConditionExpression="nope <> :v",
                                            UpdateExpression="SET n = if_not_exists(n, :z) + :one, l = :l, "
                                                             "ss = :ss REMOVE chain_due_at",
                                            ExpressionAttributeValues={":v": {"S": "x"}, ":z": {"N": "10"},
                                                                       ":one": {"N": "1"}, ":l": {"L": [{"S": "a"}]},
                                                                       ":ss": {"SS": ["x", "y"]}},
                                            ReturnValues="UPDATED_NEW")),
            attempt(lambda: ddb.update_item(TableName="jobs", Key=key,
                                            ConditionExpression="n BETWEEN :lo AND :hi AND size(l) = :one AND "
                                                                "contains(ss, :xs) AND kind IN (:k, :v) AND NOT "
                                                                "attribute_exists(nope)",
                                            UpdateExpression="SET l = list_append(l, :l), n = n - :one ADD ss :more "
                                                             "DELETE ss :x",
                                            ExpressionAttributeValues={":lo": {"N": "5"}, ":hi": {"N": "11"},
                                                                       ":one": {"N": "1"}, ":x": {"SS": ["x"]},
                                                                       ":xs": {"S": "x"},
                                                                       ":k": {"S": "image"}, ":v": {"S": "video"},
                                                                       ":l": {"L": [{"S": "b"}]},
                                                                       ":more": {"SS": ["z"]}},
                                            ReturnValues="ALL_NEW")),
            attempt(lambda: ddb.update_item(TableName="jobs", Key=key, ConditionExpression="n > :big",
                                            UpdateExpression="SET n = :big",
                                            ExpressionAttributeValues={":big": {"N": "100"}},
                                            ReturnValuesOnConditionCheckFailure="ALL_OLD"))]
    return [_plain(o) for o in out]


def _plain(value: Any) -> Any:
    """Sets of strings as sorted lists (their order is DynamoDB's, not part of the contract)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k not in ("ResponseMetadata", "ConsumedCapacity")}
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, str) for v in value) and isinstance(value, list):
            return value
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(value)
    if hasattr(value, "__dataclass_fields__"):
        return {f: _plain(getattr(value, f)) for f in value.__dataclass_fields__}
    return value


def _fake_ddb() -> Any:
    sched = Scheduler(1, NOW)
    return DynamoWorld(sched, Faults(sched.rng, {}, {}), "jobs").client


def test_the_dynamodb_fake_answers_the_job_stores_calls_as_moto_server_does(template_resources: Provisioned) -> None:
    ddb = boto3.client("dynamodb")
    real = dynamo_scenario(JobStore("jobs", 2, ddb=ddb), ddb)
    fake_client = _fake_ddb()
    fake = dynamo_scenario(JobStore("jobs", 2, ddb=fake_client), fake_client)
    assert fake == real


# -- SQS: delays, visibility, redrive, a batch's refusals ---------------------------------------------------
class RealQueue:
    def __init__(self) -> None:
        self.sqs = boto3.client("sqs")
        dlq = self.sqs.create_queue(QueueName="sim-dlq")["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.url = self.sqs.create_queue(QueueName="sim", Attributes={
            "VisibilityTimeout": "180", "RedrivePolicy": f'{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"2"}}'})[
            "QueueUrl"]
        self.dlq = dlq

    def send(self, entries: list[dict[str, Any]]) -> Any:
        return self.sqs.send_message_batch(QueueUrl=self.url, Entries=entries)

    def receive(self) -> list[tuple[str, str]]:
        reply = self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10)
        return sorted((m["Body"], m["ReceiptHandle"]) for m in reply.get("Messages", []))

    def expire(self, receipt: str) -> None:  # what the visibility timeout running out does
        self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=receipt, VisibilityTimeout=0)

    def delete(self, receipt: str) -> None:
        self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=receipt)

    def dead(self) -> list[str]:
        reply = self.sqs.receive_message(QueueUrl=self.dlq, MaxNumberOfMessages=10)
        return sorted(m["Body"] for m in reply.get("Messages", []))


class FakeQueue:
    def __init__(self) -> None:
        sched = Scheduler(1, NOW)
        self.world = SqsWorld(sched, Faults(sched.rng, {}, {}))
        dlq = self.world.queue("sim-dlq", 180)
        self.queue = self.world.queue("sim", 180, dlq=dlq, max_receive=2)
        self.dlq = dlq

    def send(self, entries: list[dict[str, Any]]) -> Any:
        return self.world.client.send_message_batch(QueueUrl=self.queue.url, Entries=entries)

    def receive(self) -> list[tuple[str, str]]:
        return sorted((m.body, r) for m, r in self.world.receive(self.queue, 10))

    def expire(self, receipt: str) -> None:
        self.queue.messages[receipt.partition("#")[0]].visible_at = self.world.sched.now

    def delete(self, receipt: str) -> None:
        self.world.delete(self.queue, receipt)

    def dead(self) -> list[str]:
        return sorted(m.body for m in self.dlq.messages.values())


def sqs_scenario(queue: Any) -> list[Any]:
    out: list[Any] = []
    reply = queue.send([{"Id": "a", "MessageBody": "now"}, {"Id": "b", "MessageBody": "later", "DelaySeconds": 600},
                        {"Id": "c", "MessageBody": "bad", "DelaySeconds": 901}])
    out.append((sorted(s["Id"] for s in reply["Successful"]), sorted((f["Id"], f["Code"]) for f in reply["Failed"])))
    for entries in ([{"Id": str(i), "MessageBody": "x"} for i in range(11)],
                    [{"Id": "same", "MessageBody": "x"}, {"Id": "same", "MessageBody": "y"}]):
        try:
            queue.send(entries)
        except ClientError as exc:
            out.append(error_code(exc))
    first = queue.receive()
    out += [[b for b, _ in first], queue.receive()]  # in flight: not received again
    queue.expire(first[0][1])
    out.append([b for b, _ in queue.receive()])
    queue.delete(first[0][1])  # an older receipt handle of it
    out.append(queue.receive())
    queue.send([{"Id": "d", "MessageBody": "again"}])
    for _ in range(2):
        received = queue.receive()
        out.append([b for b, _ in received])
        queue.expire(received[0][1])
    out += [queue.receive(), queue.dead()]  # received twice already: moved to the dead-letter queue
    return out


def test_the_sqs_fake_keeps_delays_visibility_and_the_redrive_as_moto_server_does(aws: str) -> None:
    assert sqs_scenario(FakeQueue()) == sqs_scenario(RealQueue())


# -- S3 and EventBridge: the result bucket's objects, the terminal event's reply ---------------------------------
def test_the_s3_fake_keeps_the_result_buckets_tags_as_moto_server_does(template_resources: Provisioned) -> None:
    def scenario(bucket: ResultBucket, tags: Callable[[str], dict[str, str]], exists: Callable[[str], bool]) -> Any:
        kept = bucket.put("job_1", b'{"a":1}')
        other = bucket.put("job_1", b'{"a":2}')
        before = tags(kept["result_s3_key"])
        bucket.claim(kept["result_s3_key"])
        bucket.discard(other["result_s3_key"])
        bucket.discard(other["result_s3_key"])
        return before, tags(kept["result_s3_key"]), exists(kept["result_s3_key"]), exists(other["result_s3_key"])

    s3 = boto3.client("s3")

    def real_exists(key: str) -> bool:
        return bool(s3.list_objects_v2(Bucket="results", Prefix=key).get("KeyCount"))

    real = scenario(ResultBucket("results"), lambda k: {t["Key"]: t["Value"] for t in s3.get_object_tagging(
        Bucket="results", Key=k)["TagSet"]}, real_exists)
    sched = Scheduler(1, NOW)
    world = S3World(sched, Faults(sched.rng, {}, {}))
    fake = scenario(ResultBucket("results", s3=world.client), lambda k: dict(world.objects[("results", k)].tags),
                    lambda k: ("results", k) in world.objects)
    assert fake == real


def test_the_events_fake_answers_putevents_as_moto_server_does_under_the_layers_retry_config(aws: str) -> None:
    from sim.events_fake import EventsWorld

    from sume_poller.core.aws import CLIENT_CONFIG, client
    from sume_poller.store.events import EventBus

    real = client("events").put_events(Entries=[{"Source": "s", "DetailType": "d", "Detail": '{"job_id":"j"}',
                                                 "EventBusName": "default"}])
    sched = Scheduler(1, NOW)
    world = EventsWorld(sched, Faults(sched.rng, {}, {}))
    fake_client = world.client(CLIENT_CONFIG)
    fake = fake_client.put_events(Entries=[{"Source": "s", "DetailType": "d", "Detail": '{"job_id":"j"}',
                                            "EventBusName": "default"}])
    assert {k: v for k, v in fake.items() if k != "ResponseMetadata"}.keys() == \
        {k: v for k, v in real.items() if k != "ResponseMetadata"}.keys()
    assert fake["FailedEntryCount"] == real["FailedEntryCount"] == 0 and len(fake["Entries"]) == len(real["Entries"])
    EventBus("default", events=fake_client).put_terminal("job_9", {"status": "failed"})
    assert [(e.job_id, e.detail.get("status")) for e in world.accepted] == [("j", None), ("job_9", "failed")]


# -- Sume: the transport beside the simulator's HTTP server -------------------------------------------------------
class SteppedClock(Clock):
    def __init__(self) -> None:
        self.t = NOW
        super().__init__(1.0, wall=lambda: self.t)


@pytest.fixture
def sume_pair() -> Iterator[tuple[SumeClient, SumeClient, SteppedClock, SteppedClock]]:
    """A client of the simulator's HTTP server and one of the same model in process, each on its own stepped clock."""
    config = {"seed": 5, "list_config": {"cursor": True, "fields": "full", "order": "newest_created"},
              "not_found_for": 2.0,
              "read_budget": {"per_minute": 8}}
    http_clock, model_clock = SteppedClock(), SteppedClock()
    with SumeSimulator(api_key="k", clock=http_clock, deliver_webhooks=False, **config) as server:  # type: ignore[arg-type]
        other = SumeSimulator(api_key="k", clock=model_clock, deliver_webhooks=False, **config)  # type: ignore[arg-type]
        sched = Scheduler(1, NOW)
        in_process = SumeClient(BASE, lambda: "k")
        in_process._http = Transport(sched, Faults(sched.rng, {}, {}), other.model)  # type: ignore[assignment]
        yield SumeClient(server.base_url, lambda: "k"), in_process, http_clock, model_clock


def _outcome(value: Any) -> Any:
    """An outcome with its request id and Sume's generated ids left out (each run draws its own)."""
    if hasattr(value, "__dataclass_fields__"):
        return (type(value).__name__, {f: _outcome(getattr(value, f)) for f in value.__dataclass_fields__
                                       if f not in ("request_id", "job_ids")})
    if isinstance(value, dict):
        return {k: _outcome(v) for k, v in value.items() if k not in ("request_id", "id", "result_url", "url",
                                                                      "created_at", "updated_at", "job_id")}
    if isinstance(value, list | tuple):
        return [_outcome(v) for v in value]
    return re.sub(r"job_[0-9a-f]{24}", "job_ID", value) if isinstance(value, str) else value


def test_the_client_over_the_transport_reads_what_it_reads_over_http(
        sume_pair: tuple[SumeClient, SumeClient, SteppedClock, SteppedClock]) -> None:
    http, in_process, http_clock, model_clock = sume_pair
    rng = random.Random(3)
    answers: dict[str, list[Any]] = {"http": [], "model": []}
    ids: dict[str, list[str]] = {"http": [], "model": []}
    specs = [{"duration": 4, "result_delay": 3, "faults": ["503:2", "malformed"]},
             {"duration": 2, "outcome": "failed"}, {"duration": 6, "result_shape": "list", "result_faults": ["429:1"]},
             {"duration": 1, "forbidden": True}]
    for name, client, clock in (("http", http, http_clock), ("model", in_process, model_clock)):
        for spec in specs:
            clock.t += 0.1  # one creation time each: the list's order is by it
            created = client.create("image", {"sim": spec}, f"idem-{len(ids[name])}")
            answers[name].append(_outcome(created))
            ids[name] += list(getattr(created, "job_ids", ()))
        answers[name].append(_outcome(client.create("image", {"sim": specs[0]}, "idem-0")))  # a replay
    steps = [rng.choice([0.5, 1.0, 3.0]) for _ in range(12)]
    for name, client, clock in (("http", http, http_clock), ("model", in_process, model_clock)):
        for dt in steps:
            clock.t += dt
            for job in ids[name]:
                answers[name] += [_outcome(client.get_status(job)), _outcome(client.get_result(job))]
            answers[name].append(_outcome(client.list_jobs(limit=2, status="completed")))
    assert answers["model"] == answers["http"]
