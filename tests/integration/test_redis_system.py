"""The whole system on the Redis shapes AWS runs: a cluster of three masters (ElastiCache Serverless
speaks only cluster mode) and a server that refuses anyone but an ACL user whose password comes
from Secrets Manager (ElastiCache RBAC). Every message is delivered twice, so the lease works."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from invariants import check
from scenario import NO_CREATE_BUDGET, SAFE_LEASES, SCENARIO_DEFAULTS, run, submit

from tools.services import MotoServer, RedisCluster, RedisServer
from tools.stack.inprocess import InProcessStack

pytestmark = pytest.mark.integration

SCALE = 0.02
PARAMETERS = {**SCENARIO_DEFAULTS, **NO_CREATE_BUDGET}
ENV = SAFE_LEASES


def run_jobs(stack: InProcessStack, n: int = 12) -> list[str]:
    ids = submit(stack, n, {"duration": 150, "steps": 3})
    run(stack, ids, duplicate=True)
    return ids


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster(masters=3) as c:
        yield c


def test_the_system_runs_on_a_redis_cluster(cluster: RedisCluster, moto_server: MotoServer) -> None:
    with InProcessStack(time_scale=SCALE, env=ENV, moto=moto_server,
                        parameters={**PARAMETERS, "RedisUrl": cluster.url, "RedisMode": "cluster"}) as stack:
        ids = run_jobs(stack)
        check(stack, ids, scenario="cluster-mode Redis (3 masters), every message twice", expected="completed")
        stack.fanout()  # fan-out's pipelines and cursor on the cluster too


def test_the_system_runs_on_a_redis_that_only_an_acl_user_may_use(moto_server: MotoServer) -> None:
    with RedisServer(acl_user=("sume-poller", "s3cret-" + uuid.uuid4().hex[:8])) as server, \
            InProcessStack(time_scale=SCALE, env=ENV, moto=moto_server,
                           parameters={**PARAMETERS, "RedisUrl": server.url, "RedisSecretName": "redis/acl"}) as stack:
        username, password = server.credentials
        stack.client("secretsmanager").create_secret(
            Name="redis/acl", SecretString=json.dumps({"username": username, "password": password}))
        ids = run_jobs(stack)
        check(stack, ids, scenario="password Redis (ACL user from Secrets Manager)", expected="completed")
        assert password not in stack.log_path.read_text(errors="replace")


def documented_acl_rule() -> list[str]:
    """The Redis user's rule exactly as docs/deploy.md gives it (the one ```text block after "The Redis user")."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    block = text.split("**The Redis user**", 1)[1].split("```text\n", 1)[1].split("\n```", 1)[0]
    return block.split()


@pytest.mark.parametrize("mode", ["standalone", "cluster"])
def test_the_documented_acl_rule_is_all_the_system_needs(mode: str, moto_server: MotoServer) -> None:
    """A user with the documented rule (docs/deploy.md) and nothing more runs submit, the poll chains,
    fan-out and a sweep on a standalone server and on a cluster; Redis logs no command it refused."""
    rule = documented_acl_rule()
    assert rule[0] == "~sume:poll:*" and "-@all" in rule
    service: RedisServer | RedisCluster = RedisCluster(masters=3) if mode == "cluster" else RedisServer()
    with service as redis_service:
        nodes = redis_service.nodes if isinstance(redis_service, RedisCluster) else [("127.0.0.1", redis_service.port)]
        admins = [redis.Redis(host=host, port=port, decode_responses=True) for host, port in nodes]
        for admin in admins:
            admin.execute_command("ACL", "SETUSER", "sume-poller", "reset", "on", ">acl-pw", *rule)
        parameters = {**PARAMETERS, "RedisUrl": redis_service.url, "RedisSecretName": "redis/acl",
                      "RedisMode": mode}
        with InProcessStack(time_scale=SCALE, env=ENV, moto=moto_server, parameters=parameters) as stack:
            stack.client("secretsmanager").create_secret(
                Name="redis/acl", SecretString=json.dumps({"username": "sume-poller", "password": "acl-pw"}))
            stack.sim.configure(list={"cursor": True, "order": "newest_first", "fields": "full"})
            ids = submit(stack, 24, {"duration": 300, "steps": 3})
            stack.fanout()  # counts the pending jobs: enough for the sweep's cost rule
            swept = stack.invoke("SweepFunction", {"source": "aws.events"})
            run(stack, ids)
            check(stack, ids, scenario=f"ACL user with the documented rule ({mode})", expected="completed")
            assert swept["ran"], swept
        refused = [entry for admin in admins for entry in admin.acl_log()]
        assert refused == [], refused
