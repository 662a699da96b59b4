"""Redis that answers but refuses (a misconfiguration) told apart from Redis that is gone (an
outage), on real redis-servers: what each failure counts as, the cold-start check, the lazy cluster
client, and the bound on the sets of chain finds that wait for a sweep."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from sume_poller.config.settings import RedisSettings
from sume_poller.core.jobs import KINDS
from sume_poller.discovery.coverage import FOUND_MAX, FOUND_MAX_AGE, CoverageStore
from sume_poller.limits.budget import Budget
from sume_poller.limits.gate import ReadGate
from sume_poller.limits.lease import LeaseStore
from sume_poller.limits.pacer import LocalPacer
from sume_poller.limits.redisconn import (
    MISCONFIGURED,
    UNAVAILABLE,
    ColdStartCheck,
    LazyCluster,
    RedisMisconfigured,
    check,
    connect,
    failure,
)
from tools.services import RedisCluster, free_port

pytestmark = pytest.mark.integration
NOW = 1_800_000_000.0


def parts(client: object, mode: str = "standalone") -> tuple[LeaseStore, Budget, ReadGate]:
    lease = LeaseStore(client, "sume:poll:")
    budget = Budget(client, "sume:poll:!budget:{reads}", 120, 10_000, lambda: NOW)
    return lease, budget, ReadGate(lease, budget, LocalPacer(0, 0, 1), cluster=mode == "cluster")


def settings(url: str, mode: str = "standalone") -> RedisSettings:
    return RedisSettings(url=url, mode=mode, secret_name=None)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster(masters=3) as c:
        yield c


def test_a_refused_command_is_a_misconfiguration_and_a_lost_connection_an_outage(rdb: redis.Redis) -> None:
    rdb.set("sume:poll:!budget:{reads}", "not a hash")  # WRONGTYPE for the budget's HMGET
    _, budget, _ = parts(rdb)
    with pytest.raises(redis.ResponseError) as wrongtype:
        budget.take()
    assert failure(wrongtype.value) == MISCONFIGURED
    user = "u" + uuid.uuid4().hex[:6]
    rdb.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "+@all", "-evalsha")
    limited = redis.Redis(host=rdb.connection_pool.connection_kwargs["host"],
                          port=rdb.connection_pool.connection_kwargs["port"], username=user, password="pw",
                          decode_responses=True)
    with pytest.raises(redis.exceptions.NoPermissionError) as noperm:
        parts(limited)[1].take()
    assert failure(noperm.value) == MISCONFIGURED
    gone = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    with pytest.raises(redis.ConnectionError) as refused:
        gone.ping()
    assert failure(refused.value) == UNAVAILABLE


def test_the_cold_start_check_fails_loudly_on_a_cluster_endpoint_in_standalone_mode(cluster: RedisCluster) -> None:
    client = connect(settings(cluster.url, "standalone"))
    with pytest.raises(RedisMisconfigured, match="RedisMode=cluster"):
        check(client, "standalone", parts(client)[2].probe)


def test_the_cold_start_check_fails_loudly_on_a_user_missing_a_command(rdb: redis.Redis) -> None:
    user = "u" + uuid.uuid4().hex[:6]
    rdb.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "+@all", "-evalsha", "-eval")
    port = rdb.connection_pool.connection_kwargs["port"]
    limited = redis.Redis(port=port, username=user, password="pw", decode_responses=True)
    with pytest.raises(RedisMisconfigured, match="NoPermissionError"):
        check(limited, "standalone", parts(limited)[2].probe)


def test_the_cold_start_check_passes_on_the_right_redis_and_waits_out_an_outage(rdb: redis.Redis,
                                                                              cluster: RedisCluster) -> None:
    check(rdb, "standalone", parts(rdb)[2].probe)
    clustered = connect(settings(cluster.url, "cluster"))
    check(clustered, "cluster", parts(clustered, "cluster")[2].probe)
    assert clustered.exists("sume:poll:!probe") == 0  # the probe leaves nothing behind
    gone = connect(settings(f"redis://127.0.0.1:{free_port()}/0"))
    checked = ColdStartCheck(gone, "standalone", parts(gone)[2].probe)
    checked()  # an outage is not a misconfiguration: no raise, and the check runs again next time
    assert not checked.passed


def test_a_cluster_client_built_during_an_outage_works_once_the_cluster_answers() -> None:
    """redis-py's cluster client maps the slots when it is built and raises if no node answers:
    a container that cold-starts during an outage must not fail every invocation until replaced."""
    with RedisCluster(masters=3) as later:
        url = later.url
        later.stop()
        client = connect(settings(url, "cluster"))
        assert isinstance(client, LazyCluster)
        lease, _, gate = parts(client, "cluster")  # scripts register without a node
        with pytest.raises(redis.ConnectionError) as down:
            client.ping()
        assert failure(down.value) == UNAVAILABLE
        later.start()
        assert client.ping() and lease.start("job_x", uuid.uuid4().hex, 10_000)
        gate.probe()


def test_not_a_cluster_is_a_misconfiguration_for_the_lazy_cluster_client(rdb: redis.Redis) -> None:
    port = rdb.connection_pool.connection_kwargs["port"]
    client = connect(settings(f"redis://127.0.0.1:{port}/0", "cluster"))
    with pytest.raises(Exception) as wrong:
        client.ping()
    assert failure(wrong.value) == MISCONFIGURED


def test_the_sets_of_chain_finds_stay_bounded_while_sweeps_are_idle(rdb: redis.Redis) -> None:
    """Thousands of chain finds over two days and no complete sweep: each kind's set keeps at most
    FOUND_MAX members, none older than FOUND_MAX_AGE, and a sweep's judgement reads per kind."""
    store = CoverageStore(rdb, "sume:poll:")
    for i in range(4_000):
        store.found("video", f"job_{i:05d}", NOW + i * 43.2)  # 4,000 finds over 48 hours
    newest = NOW + 3_999 * 43.2
    members = rdb.zrange(store.found_key("video"), 0, -1, withscores=True)
    assert len(members) <= FOUND_MAX and min(at for _, at in members) >= newest - FOUND_MAX_AGE
    assert 0 < rdb.pttl(store.found_key("video")) <= FOUND_MAX_AGE * 1000
    for i in range(FOUND_MAX + 500):  # finds in a burst: the newest FOUND_MAX stay
        store.found("image", f"job_i{i:05d}", newest + i * 0.01)
    assert rdb.zcard(store.found_key("image")) == FOUND_MAX
    assert rdb.zscore(store.found_key("image"), f"job_i{FOUND_MAX + 499:05d}") is not None
    verdicts = store.judge({"video": {"job_03999"}}, swept_from=newest + 100, lag=60)
    assert verdicts["video"] == (1, len(members) - 1) and set(verdicts) <= set(KINDS)


def test_a_sweep_of_some_statuses_judges_only_the_finds_of_those(rdb: redis.Redis) -> None:
    """A find carries its status (and submission); one kept without a status, as before, waits for a
    sweep of every status."""
    store = CoverageStore(rdb, "sume:poll:")
    store.found("video", "job_done", NOW, NOW - 600, "completed")
    store.found("video", "job_failed", NOW, None, "failed")
    store.found("video", "job_old", NOW)  # kept without a status
    swept = NOW + 300
    some = store.judge({"video": {"job_done"}}, swept_from=swept, lag=60, statuses=frozenset({"completed"}))
    assert some["video"] == (1, 0)  # job_failed and job_old not judged: neither listed nor missed
    assert rdb.zcard(store.found_key("video")) == 2
    bounded = store.judge({}, swept_from=swept, lag=60, created_after=NOW - 60, statuses=frozenset({"failed"}))
    assert bounded.get("video", (0, 0)) == (0, 0)  # job_failed has no submission time: a bounded sweep skips it
    every = store.judge({"video": {"job_failed"}}, swept_from=swept, lag=60)
    assert every["video"] == (1, 1) and rdb.zcard(store.found_key("video")) == 0  # job_old: a miss
