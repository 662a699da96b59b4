"""Shared fixtures: real redis-server and moto server (child processes on free ports), the Sume
simulator (a real HTTP server), and the template's functions wired to them (tools.localrun)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from tools.localrun import LocalSystem
from tools.services import MotoServer, RedisServer
from tools.sume_sim import SumeSimulator

API_KEY = "sume_test_" + uuid.uuid4().hex

#: Short leases so crash-recovery tests wait seconds, not minutes (production: 30 s / 60 s).
TEST_ENV = {
    "LEASE_MARGIN_SECONDS": "2",
    "CLAIM_TTL_SECONDS": "5",
    "SUME_CONNECT_TIMEOUT": "1",
    "SUME_READ_TIMEOUT": "1.5",
    "AUTH_PAUSE_SECONDS": "5",
    "POWERTOOLS_METRICS_NAMESPACE": "SumePollerTest",
}


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session")
def simulator() -> Iterator[SumeSimulator]:
    with SumeSimulator(api_key=API_KEY, hints=True) as sim:
        yield sim


@pytest.fixture(scope="session")
def local_system(redis_server: RedisServer, moto_server: MotoServer, simulator: SumeSimulator) -> LocalSystem:
    return LocalSystem(moto_server.endpoint_url, redis_server.url, simulator.base_url,
                       api_key=API_KEY, env_overrides=TEST_ENV)


@pytest.fixture
def system(local_system: LocalSystem, simulator: SumeSimulator, redis_server: RedisServer) -> LocalSystem:
    """The session's system with empty queues, a fresh simulator and an empty Redis."""
    local_system.fresh()
    simulator.reset()
    simulator.configure(api_key=API_KEY)
    redis.Redis.from_url(redis_server.url).flushall()
    from sume_poller import runtime
    runtime.redis_client().connection_pool.reset()
    return local_system


@pytest.fixture
def fsys(system: LocalSystem) -> Iterator[LocalSystem]:
    """``system`` with Powertools' parameter cache cleared on both sides: some fault scenarios
    rotate the Sume key, and a rotated key must not leak into the next test as 401s."""
    from aws_lambda_powertools.utilities import parameters
    parameters.clear_caches()
    yield system
    parameters.clear_caches()


@pytest.fixture
def rdb(redis_server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(redis_server.url, decode_responses=True)
