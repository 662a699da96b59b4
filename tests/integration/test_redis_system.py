"""The whole system on the Redis shapes AWS runs: a cluster of three masters (ElastiCache Serverless
speaks only cluster mode) and a server that refuses anyone but an ACL user whose password comes
from Secrets Manager (ElastiCache RBAC). Every message is delivered twice, so the lease works."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
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
