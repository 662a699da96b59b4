"""Redis as AWS runs it, against real servers: replies lost or late on the network (a TCP proxy
that lets a command run and drops its reply), a failover's READONLY, cluster mode (three masters),
and an ACL user whose password comes from Secrets Manager."""

from __future__ import annotations

import json
from collections.abc import Iterator

import boto3
import pytest
import redis
from redis.exceptions import RedisError

from sume_poller.config.settings import RedisSettings
from sume_poller.limits.budget import Budget
from sume_poller.limits.gate import ReadGate
from sume_poller.limits.lease import Claim, LeaseStore, Step, new_nonce, new_token
from sume_poller.limits.pacer import LocalPacer
from sume_poller.limits.redisconn import connect, reconnect
from tools.faultproxy import FaultProxy
from tools.services import RedisCluster, RedisServer

pytestmark = pytest.mark.integration
TTL = 60_000


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", redis_server.port) as p:
        yield p


def via(proxy: FaultProxy, timeout: float = 0.3) -> LeaseStore:
    client = connect(RedisSettings(url=proxy.url, mode="standalone", secret_name=None, timeout_real=timeout))
    return LeaseStore(client, "t:net:")


def test_a_lost_reply_after_the_script_ran_is_repeated_and_still_succeeds(proxy: FaultProxy, rdb: redis.Redis) -> None:
    """The claim, rest, start and release each run on the server, their reply is lost, redis-py
    sends the same script again, and it finds its own value: the chain goes on."""
    lease = via(proxy)
    token = new_token()
    lease.start("job_n", "0" * 32, TTL)  # loads the scripts through the proxy
    lease.release("job_n", "0" * 32 + ":0")
    for command in ("EVALSHA",):
        proxy.drop_reply(command)
    assert lease.start("job_n", token, TTL)
    step = Step(token, 0, new_nonce())
    proxy.drop_reply("EVALSHA")
    assert lease.claim("job_n", step, Step(new_token(), 0, step.nonce), TTL) is Claim.OWN
    proxy.drop_reply("EVALSHA")
    assert lease.rest("job_n", step, TTL)
    assert rdb.get("t:net:job_n") == f"{token}:1"
    nxt = Step(token, 1, new_nonce())
    lease.claim("job_n", nxt, Step(new_token(), 0, nxt.nonce), TTL)
    proxy.drop_reply("EVALSHA")
    assert lease.release("job_n", nxt.claimed)
    assert rdb.get("t:net:job_n") is None
    assert proxy.applied[("drop_reply", "EVALSHA")] == 4


def test_a_reply_later_than_the_socket_timeout_is_repeated_and_still_succeeds(proxy: FaultProxy,
                                                                               rdb: redis.Redis) -> None:
    lease = via(proxy, timeout=0.2)
    token = new_token()
    lease.start("job_t", token, TTL)
    step = Step(token, 0, new_nonce())
    proxy.delay_reply("EVALSHA", 1.0)
    assert lease.claim("job_t", step, Step(new_token(), 0, step.nonce), TTL) is Claim.OWN
    assert rdb.get("t:net:job_t") == step.claimed


def test_readonly_after_a_failover_is_redis_unavailable_and_reconnects(proxy: FaultProxy) -> None:
    lease = via(proxy)
    lease.start("job_r", new_token(), TTL)
    proxy.inject_error("EVALSHA", "READONLY You can't write against a read only replica.")
    with pytest.raises(RedisError) as caught:
        lease.start("job_other", new_token(), TTL)
    assert type(caught.value).__name__ == "ReadOnlyError"
    pool = lease.client.connection_pool
    in_use = list(pool._available_connections)
    reconnect(lease.client, caught.value)
    assert all(c._sock is None for c in in_use)  # dropped: the next command resolves the endpoint again
    assert lease.start("job_other2", new_token(), TTL)


def test_an_outage_is_a_redis_error_the_poller_can_catch(proxy: FaultProxy) -> None:
    lease = via(proxy)
    proxy.refuse()
    with pytest.raises(RedisError):
        lease.start("job_o", new_token(), TTL)
    proxy.accept()
    assert lease.start("job_o", new_token(), TTL)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster(masters=3) as c:
        yield c


def test_the_lease_budget_and_gate_run_unchanged_in_cluster_mode(cluster: RedisCluster) -> None:
    client = connect(RedisSettings(url=cluster.url, mode="cluster", secret_name=None))
    lease = LeaseStore(client, "c:lease:")
    now = [1_800_000_000.0]
    budget = Budget(client, "c:lease:!budget:{reads}", 120, 10_000, lambda: now[0], early=0.0)
    gate = ReadGate(lease, budget, LocalPacer(0, 0, 1), cluster=True)
    jobs = [f"job_{i}" for i in range(30)]
    tokens = {j: new_token() for j in jobs}
    assert all(lease.start_many(list(tokens.items()), TTL))  # a cluster pipeline over every master
    slots = {client.keyslot(lease.key(j)) for j in jobs}
    assert len({client.nodes_manager.get_node_from_slot(s).port for s in slots}) == 3
    for job_id in jobs:
        step = Step(tokens[job_id], 0, new_nonce())
        passage = gate.enter(job_id, step, Step(new_token(), 0, step.nonce), TTL)
        assert passage.claim is Claim.OWN and passage.grant is not None
        assert lease.rest(job_id, step, TTL)
    assert lease.hand_over("job_0", new_token(), TTL) == (tokens["job_0"], 2, None)
    assert lease.hand_over("job_0", new_token(), TTL) is None  # handed over already
    assert budget.state()["minute_tat"] > now[0] * 1000


def test_an_acl_user_from_secrets_manager_authenticates(aws: str) -> None:
    with RedisServer(acl_user=("poller", "s3cret-pw")) as server:
        boto3.client("secretsmanager").create_secret(
            Name="redis/poller", SecretString=json.dumps({"username": "poller", "password": "s3cret-pw"}))
        client = connect(RedisSettings(url=server.url, mode="standalone", secret_name="redis/poller"))
        assert LeaseStore(client, "t:acl:").start("job_a", new_token(), TTL)
        anonymous = redis.Redis.from_url(server.url, retry=None)
        with pytest.raises(RedisError):
            anonymous.set("x", "1")
