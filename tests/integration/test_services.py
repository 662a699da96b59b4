"""The local services against real processes: redis-server in the shapes AWS runs (AUTH token,
ACL user, cluster mode), the fault proxy between redis-py and redis-server, and the template
created in moto server (tools.template: the SAM transform, then moto's CloudFormation)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import boto3
import pytest
import redis
from mirakuru.base import ENV_UUID
from mirakuru.base_env import processes_with_env
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster as ClusterClient
from redis.retry import Retry

from tools import services
from tools.faultproxy import FaultProxy
from tools.services import MotoServer, RedisCluster, RedisServer, ServiceError, free_port
from tools.template import aws_clients, create_stack, load, translate

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
READONLY = "READONLY You can't write against a read only replica."
CLUSTER_PASSWORD = "cluster-secret"


def no_retry() -> Retry:
    """redis-py retries failed connections with backoff by default (seconds per test)."""
    return Retry(NoBackoff(), 0)


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s: {condition}")
        time.sleep(0.01)


def ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


# --------------------------------------------------------------------------------------------
# Service lifecycle
# --------------------------------------------------------------------------------------------


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_port_is_below_the_ephemeral_range_and_skips_a_taken_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outbound connections take their local ports from the ephemeral range: a port there may be gone by the
    time a service binds it."""
    assert services.PORT_FLOOR <= free_port() < services._ephemeral_low()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        draw, picks = services._RANDOM.randrange, []

        def busy_first(start: int, stop: int) -> int:  # the taken port, then what the OS's randomness draws
            picks.append(busy if not picks else draw(start, stop))
            return picks[-1]

        monkeypatch.setattr(services, "_ephemeral_low", lambda: 65536)
        monkeypatch.setattr(services._RANDOM, "randrange", busy_first)
        port = free_port()
        assert port != busy and picks[0] == busy and port == picks[-1]


def test_a_process_whose_pid_begins_ours_does_not_kill_our_services_at_its_exit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """mirakuru's exit hook SIGKILLs every process whose marker contains the exiting process's pid: an exiting
    process of pid 3015 killed the services of processes 3015x (a CI run's moto, mid-test). Its hook, run here as
    if by such processes (our pid less a digit, and single digits: a uuid holds most), leaves this process's
    service alone; this process's own hook finds it."""
    import mirakuru.base

    port = free_port()  # a Python server: redis-server writes its title over its environment, where markers are
    with services.Service([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)], port) as server:
        assert server.process.pid in processes_with_env(ENV_UUID, services._marker())
        for other in (int(str(os.getpid())[:-1]), *range(10)):
            monkeypatch.setattr(os, "getpid", lambda other=other: other)
            mirakuru.base.cleanup_subprocesses()
            monkeypatch.undo()
        assert server.process.poll() is None, "SIGKILLed by another process's exit hook"


def test_redis_server_start_stop_restart() -> None:
    server = RedisServer().start()  # `make setup` installs redis-server; a missing one fails here
    try:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert server.credentials is None
        assert ping(server.port)
        pid = server.pid
        server.stop()
        assert not ping(server.port)
        server.restart()
        assert server.pid != pid and ping(server.port)
    finally:
        server.stop()
    assert not server.running()


def test_service_on_a_taken_port_is_refused() -> None:
    with RedisServer() as first:
        with pytest.raises(ServiceError, match="already in use"):
            RedisServer(port=first.port).start()
        assert ping(first.port)


def test_moto_on_a_port_another_server_took_moves_to_a_free_one() -> None:
    """A CI run's moto port was taken between free_port() and moto's bind by a server answering 404:
    moto is ready only once moto answers, and starts again on a new port."""
    import http.server
    import threading

    other = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # 501s to everything
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        with MotoServer(port=other.server_address[1]) as moto:
            assert moto.port != other.server_address[1]
            moto.reset()  # moto's own route answers
    finally:
        other.shutdown()


def test_service_that_dies_reports_its_output() -> None:
    server = RedisServer(extra=["--no-such-option", "1"])
    with pytest.raises(ServiceError, match="exited with code") as info:
        server.start()
    assert "output tail" in str(info.value)
    assert "no-such-option" in str(info.value)
    assert not server.running()


def test_missing_redis_binary_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tools.services.shutil.which", lambda name: None)
    monkeypatch.setattr("tools.services.os.access", lambda path, mode: False)
    with pytest.raises(ServiceError, match="apt-get install redis-server"):
        RedisServer().start()


# --------------------------------------------------------------------------------------------
# Redis with an AUTH token, with an ACL user
# --------------------------------------------------------------------------------------------


def test_password_server_refuses_unauthenticated_commands_and_accepts_the_password() -> None:
    with RedisServer(password="token with spaces & symbols!") as server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"  # no credentials in the URL
        assert server.credentials == (None, "token with spaces & symbols!")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(server.url, retry=no_retry()).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(server.url, password="wrong", retry=no_retry()).ping()
        username, password = server.credentials
        client = redis.Redis.from_url(server.url, username=username, password=password, decode_responses=True)
        assert client.set("k", "v") and client.get("k") == "v"
        assert client.acl_whoami() == "default"


def test_acl_user_works_and_the_default_user_is_refused() -> None:
    with RedisServer(acl_user=("poller", "p4ss")) as server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert server.credentials == ("poller", "p4ss")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(server.url, retry=no_retry()).ping()
        with pytest.raises(redis.AuthenticationError):  # the default user is disabled, whatever the password
            redis.Redis.from_url(server.url, username="default", password="p4ss", retry=no_retry()).ping()
        client = redis.Redis.from_url(server.url, username="poller", password="p4ss", decode_responses=True)
        assert client.acl_whoami() == "poller"
        assert client.eval("return redis.call('INCRBY', KEYS[1], ARGV[1])", 1, "n", 3) == 3
        assert client.info("server")["process_id"] == server.pid


def test_password_and_acl_user_together_are_refused() -> None:
    with pytest.raises(ValueError, match="not both"):
        RedisServer(password="a", acl_user=("u", "b"))


# --------------------------------------------------------------------------------------------
# Redis cluster (started once for the module)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    server = RedisCluster(masters=3, password=CLUSTER_PASSWORD).start()
    try:
        files = []
        for _, port in server.nodes:
            node = redis.Redis(port=port, password=CLUSTER_PASSWORD, decode_responses=True)
            files.append(Path(str(node.config_get("cluster-config-file")["cluster-config-file"])))
        assert all(path.exists() for path in files)
        yield server
    finally:
        server.stop()
    assert not server.running()
    assert not any(path.exists() for path in files)  # stop removes the nodes' files
    assert not any(ping(port) for _, port in server.nodes)


def cluster_client(cluster: RedisCluster) -> Any:
    host, port = cluster.nodes[0]
    return ClusterClient(host=host, port=port, password=CLUSTER_PASSWORD, decode_responses=True)


def test_cluster_is_ok_on_every_node(cluster: RedisCluster) -> None:
    assert len(cluster.nodes) == 3 and len({port for _, port in cluster.nodes}) == 3
    assert cluster.url == f"redis://127.0.0.1:{cluster.nodes[0][1]}"
    assert cluster.credentials == (None, CLUSTER_PASSWORD)
    for _, port in cluster.nodes:
        node = redis.Redis(port=port, password=CLUSTER_PASSWORD, decode_responses=True)
        info = node.cluster("INFO")
        assert info["cluster_state"] == "ok"
        assert int(info["cluster_known_nodes"]) == 3 and int(info["cluster_slots_assigned"]) == 16384
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, retry=no_retry()).ping()


def test_cluster_client_spreads_keys_over_every_master_and_runs_a_script(cluster: RedisCluster) -> None:
    client = cluster_client(cluster)
    keys_by_port: dict[int, str] = {}
    for i in range(100):
        key = f"spread:{i}"
        keys_by_port.setdefault(client.get_node_from_key(key).port, key)
    assert set(keys_by_port) == {port for _, port in cluster.nodes}
    for port, key in keys_by_port.items():
        assert client.set(key, f"on-{port}")
        assert client.get(key) == f"on-{port}"
        node = redis.Redis(port=port, password=CLUSTER_PASSWORD, decode_responses=True)
        assert node.get(key) == f"on-{port}"  # stored on that master (another would answer MOVED)

    script = "redis.call('HSET', KEYS[1], 'owner', ARGV[1]); return redis.call('HINCRBY', KEYS[1], 'n', 1)"
    assert client.eval(script, 1, "lease:{job-1}", "me") == 1
    incr = client.register_script(script)  # EVALSHA, routed by the key's slot
    assert incr(keys=["lease:{job-1}"], args=["me"]) == 2
    assert client.hgetall("lease:{job-1}") == {"owner": "me", "n": "2"}


# --------------------------------------------------------------------------------------------
# The fault proxy between redis-py and redis-server
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def proxy(target: RedisServer) -> Iterator[FaultProxy]:
    redis.Redis.from_url(target.url).flushall()
    with FaultProxy("127.0.0.1", target.port) as fault_proxy:
        yield fault_proxy


@pytest.fixture
def direct(target: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(target.url, decode_responses=True)


def through(proxy: FaultProxy, socket_timeout: float = 2.0) -> redis.Redis:
    return redis.Redis.from_url(proxy.url, socket_timeout=socket_timeout, retry=no_retry(), decode_responses=True)


def test_proxy_forwards_and_counts_commands(proxy: FaultProxy, direct: redis.Redis) -> None:
    client = through(proxy)
    assert client.set("a", "1") and client.get("a") == "1" and client.get("a") == "1"
    assert direct.get("a") == "1"
    assert proxy.seen["SET"] == 1 and proxy.seen["GET"] == 2
    assert proxy.applied == {}
    assert proxy.url == f"redis://127.0.0.1:{proxy.port}/0"


def test_drop_reply_runs_the_command_but_the_client_sees_a_connection_error(
    proxy: FaultProxy, direct: redis.Redis
) -> None:
    client = through(proxy)
    assert client.ping()
    proxy.drop_reply("set")
    with pytest.raises(redis.ConnectionError):
        client.set("k", "v")
    assert direct.get("k") == "v"  # it ran
    assert proxy.applied["drop_reply", "SET"] == 1
    wait_until(lambda: proxy.connections == 0)
    assert client.set("k", "w") and direct.get("k") == "w"  # armed once: the next one goes through


def test_drop_reply_of_evalsha_after_the_script_ran(proxy: FaultProxy, direct: redis.Redis) -> None:
    client = through(proxy)
    take = client.register_script("return redis.call('INCR', KEYS[1])")
    assert take(keys=["lease"]) == 1
    proxy.drop_reply("EVALSHA")
    with pytest.raises(redis.ConnectionError):
        take(keys=["lease"])
    assert direct.get("lease") == "2"  # the client cannot tell whether it took it
    assert proxy.applied["drop_reply", "EVALSHA"] == 1


def test_delay_reply_past_the_socket_timeout_is_a_timeout(proxy: FaultProxy, direct: redis.Redis) -> None:
    client = through(proxy, socket_timeout=0.3)
    assert client.ping()
    proxy.delay_reply("SET", seconds=30)
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.set("slow", "1")
    assert direct.get("slow") == "1"  # it ran; only the reply was late
    assert proxy.applied["delay_reply", "SET"] == 1
    # The client hung up on timeout: the proxy lets go of the held reply at once.
    wait_until(lambda: proxy.connections == 0)
    assert time.monotonic() - started < 5


def test_delay_reply_shorter_than_the_timeout_arrives_late(proxy: FaultProxy) -> None:
    client = through(proxy, socket_timeout=5)
    client.set("k", "v")
    proxy.delay_reply("get", seconds=0.2, times=2)
    for _ in range(2):
        started = time.monotonic()
        assert client.get("k") == "v"
        assert time.monotonic() - started >= 0.2
    assert client.get("k") == "v"
    assert proxy.applied["delay_reply", "GET"] == 2  # armed twice: the third one was not held


def test_injected_readonly_error_is_a_readonly_error(proxy: FaultProxy, direct: redis.Redis) -> None:
    client = through(proxy)
    proxy.inject_error("SET", READONLY)
    with pytest.raises(redis.exceptions.ReadOnlyError, match="read only replica"):
        client.set("k", "v")
    assert direct.get("k") is None  # never reached the server
    assert proxy.applied["inject_error", "SET"] == 1 and proxy.seen["SET"] == 1
    assert client.set("k", "v") and direct.get("k") == "v"  # the same connection goes on


def test_pipelined_replies_stay_in_order_around_an_injected_one(proxy: FaultProxy, direct: redis.Redis) -> None:
    client = through(proxy)
    proxy.inject_error("GET", READONLY)
    proxy.delay_reply("SET", seconds=0.1)  # the first SET's reply comes late: the injected one waits
    pipe = client.pipeline(transaction=False)
    pipe.set("a", "1")
    pipe.get("a")
    pipe.set("b", "2")
    pipe.get("b")
    pipe.lrange("list", 0, -1)
    replies = pipe.execute(raise_on_error=False)
    assert replies[0] is True and replies[2] is True and replies[3] == "2" and replies[4] == []
    assert isinstance(replies[1], redis.exceptions.ReadOnlyError)
    assert direct.mget("a", "b") == ["1", "2"]


def test_commands_split_over_packets_and_nested_replies(proxy: FaultProxy) -> None:
    script = b"return {1, {2, 'x'}, 'y', {}}"
    command = b"*3\r\n$4\r\nEVAL\r\n$%d\r\n%s\r\n$1\r\n0\r\n" % (len(script), script)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        proxy.inject_error("PING", "ERR injected")
        data = command + b"*1\r\n$4\r\nPING\r\n" + command + b"PING\r\n"  # the last one inline
        for i in range(0, len(data), 7):
            sock.sendall(data[i : i + 7])
        expected = b"*4\r\n:1\r\n*2\r\n:2\r\n$1\r\nx\r\n$1\r\ny\r\n*0\r\n"
        wanted = expected + b"-ERR injected\r\n" + expected + b"+PONG\r\n"
        received = b""
        while len(received) < len(wanted):
            chunk = sock.recv(4096)
            assert chunk, received
            received += chunk
    assert received == wanted
    assert proxy.seen == {"EVAL": 2, "PING": 2}


def test_refuse_closes_connections_until_accept(proxy: FaultProxy) -> None:
    client = through(proxy)
    assert client.ping()
    assert proxy.connections == 1
    proxy.refuse()
    assert proxy.connections == 0
    with pytest.raises(redis.ConnectionError):
        client.ping()  # the open connection was closed
    with pytest.raises(redis.ConnectionError):
        through(proxy).ping()  # and a new one is closed at once
    proxy.accept()
    assert client.ping()
    assert through(proxy).ping()


def test_faults_are_armed_per_command_name_and_count(proxy: FaultProxy) -> None:
    client = through(proxy)
    proxy.inject_error("incrby", "ERR first", times=2)  # redis-py's incr() sends INCRBY
    proxy.inject_error("INCRBY", "ERR second")
    messages = []
    for _ in range(4):
        try:
            messages.append(str(client.incr("n")))
        except redis.ResponseError as error:
            messages.append(str(error))
    assert messages == ["first", "first", "second", "1"]
    assert client.get("x") is None  # other commands untouched
    assert proxy.applied == {("inject_error", "INCRBY"): 3}
    proxy.drop_reply("GET")
    proxy.clear()
    assert client.get("x") is None
    with pytest.raises(ValueError):
        proxy.drop_reply("GET", times=0)


# --------------------------------------------------------------------------------------------
# Provisioning in moto server
# --------------------------------------------------------------------------------------------


@pytest.fixture
def moto(moto_server: MotoServer) -> Iterator[MotoServer]:
    """This process's moto server, emptied after the test."""
    yield moto_server
    moto_server.reset()


def aws_client(service: Literal["dynamodb", "sqs", "s3"], moto: MotoServer) -> Any:
    return boto3.client(
        service,
        endpoint_url=moto.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def create(tmp_path: Path, text: str, moto: MotoServer, stack_name: str = "sume-poller") -> Any:
    path = tmp_path / "template.yaml"
    path.write_text(text, encoding="utf-8")
    return create_stack(aws_clients(moto.endpoint_url), translate(load(path)), stack_name=stack_name)


def test_the_project_template_is_created_in_moto_as_it_declares_its_resources(moto: MotoServer) -> None:
    parameters = {"RedisUrl": "redis://127.0.0.1:6379/0"}
    template = load(ROOT / "template.yaml")
    created = create_stack(aws_clients(moto.endpoint_url), translate(template, parameters), parameters,
                           names={"JobsTable": "jobs-under-test"})
    assert created["JobsTable"] == created.outputs["JobsTableName"] == "jobs-under-test"
    assert {"PollQueue", "PollDeadLetterQueue", "ResultBucket", "PollFunction", "PollFunctionRole"} <= set(
        created.resources)
    # moto has no model for alarms: each is an SSM parameter holding its resolved properties
    assert created.types["DeadLetterAlarm"] == "AWS::CloudWatch::Alarm"
    assert created.properties["DeadLetterAlarm"]["Dimensions"] == [
        {"Name": "QueueName", "Value": created["PollDeadLetterQueue"].rsplit("/", 1)[1]}]

    ddb = aws_client("dynamodb", moto)
    table = ddb.describe_table(TableName="jobs-under-test")["Table"]
    props = template["Resources"]["JobsTable"]["Properties"]
    assert table["KeySchema"] == props["KeySchema"]
    assert table["BillingModeSummary"]["BillingMode"] == props["BillingMode"]
    (gsi,) = table["GlobalSecondaryIndexes"]
    assert gsi["IndexName"] == props["GlobalSecondaryIndexes"][0]["IndexName"]
    assert gsi["KeySchema"] == props["GlobalSecondaryIndexes"][0]["KeySchema"]
    assert gsi["Projection"] == props["GlobalSecondaryIndexes"][0]["Projection"]

    sqs = aws_client("sqs", moto)
    dlq_arn = sqs.get_queue_attributes(QueueUrl=created["PollDeadLetterQueue"], AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    attrs = sqs.get_queue_attributes(QueueUrl=created["PollQueue"], AttributeNames=["All"])["Attributes"]
    queue_props = template["Resources"]["PollQueue"]["Properties"]
    assert int(attrs["VisibilityTimeout"]) == queue_props["VisibilityTimeout"]
    redrive = json.loads(attrs["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == dlq_arn
    assert int(redrive["maxReceiveCount"]) == queue_props["RedrivePolicy"]["maxReceiveCount"]

    aws_client("s3", moto).head_bucket(Bucket=created["ResultBucket"])

    poll = created.functions["PollFunction"]
    assert poll.environment["JOBS_TABLE"] == "jobs-under-test"
    assert poll.environment["POLL_QUEUE_URL"] == created["PollQueue"]
    assert poll.environment["RESULT_BUCKET"] == created["ResultBucket"]
    assert (poll.code_dir, poll.layer_dirs) == (ROOT / "functions" / "poll", [ROOT / "layers" / "sume_poller"])
    assert created.mappings["PollFunction"]["EventSourceArn"] == attrs["QueueArn"]
    assert created.mappings["PollFunction"]["State"] == "Disabled"  # the stack plays it: moto would run Docker
    assert created.schedules == {"FanOutFunction": "rate(1 minute)", "SweepFunction": "rate(1 minute)"}


INLINE_TEMPLATE = """\
Parameters:
  WithExtra: {Type: String, Default: "no"}
Conditions:
  Extra: !Equals [!Ref WithExtra, "yes"]
Resources:
  Main:
    Type: AWS::SQS::Queue
    DependsOn: Later
    Properties: {DelaySeconds: 2}
  Later:
    Type: AWS::SQS::Queue
  Optional:
    Type: AWS::SQS::Queue
    Condition: Extra
  Files:
    Type: AWS::S3::Bucket
  Alarm:
    Type: AWS::CloudWatch::Alarm
    Properties: {AlarmDescription: !Sub "on ${Main.QueueName}"}
"""


def test_stacks_get_unique_names_and_false_conditions_create_nothing(tmp_path: Path, moto: MotoServer) -> None:
    first = create(tmp_path, INLINE_TEMPLATE, moto, "first")
    second = create(tmp_path, INLINE_TEMPLATE, moto, "second")
    assert set(first.resources) == {"Main", "Later", "Files", "Alarm"}  # the false condition's queue is not made
    assert first["Main"] != second["Main"] and first["Files"] != second["Files"]
    assert "/first-Main-" in first["Main"]
    sqs = aws_client("sqs", moto)
    attrs = sqs.get_queue_attributes(QueueUrl=first["Main"], AttributeNames=["DelaySeconds"])
    assert attrs["Attributes"]["DelaySeconds"] == "2"
    s3 = aws_client("s3", moto)
    buckets = {bucket["Name"] for bucket in s3.list_buckets()["Buckets"]}
    assert {first["Files"], second["Files"]} <= buckets
    assert first.properties["Alarm"] == {"AlarmDescription": f"on {first['Main'].rsplit('/', 1)[1]}"}


def test_moto_reset_forgets_resources(tmp_path: Path, moto: MotoServer) -> None:
    create(tmp_path, "Resources:\n  Q:\n    Type: AWS::SQS::Queue\n", moto)
    sqs = aws_client("sqs", moto)
    assert sqs.list_queues().get("QueueUrls")
    moto.reset()
    assert not sqs.list_queues().get("QueueUrls")
