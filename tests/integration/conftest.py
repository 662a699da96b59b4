"""Fixtures of the integration tier: real redis-server and moto server, started by the tests themselves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from sume_poller.core.aws import reset_session
from tools.services import MotoServer, RedisServer
from tools.template import Created, aws_clients, create_stack, load, translate

#: The tier's longest modules (seconds of test time in a clean-clone CI run), run first: xdist
#: hands each worker whole modules (--dist loadfile) in collection order, and a long module
#: started last kept one worker busy ~30 s after the others were done. Only an ordering hint:
#: a stale entry costs time, never a test.
LONGEST_FIRST = ("test_sweeps_lists", "test_faults_sume", "test_faults_keys", "test_faults_chains",
                 "test_sweeps_system", "test_budget_system", "test_webhooks_system", "test_redis_system",
                 "test_schedule_system", "test_events_invoke", "test_budget_properties", "test_faults_create_queue",
                 "test_long_spans", "test_faults_redis", "test_faults_timing")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: a module's own order stays


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def rdb(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushall()
    yield client
    client.close()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture
def aws(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto server as the AWS endpoint for boto3 in this process, reset after the test."""
    for name, value in {"AWS_ENDPOINT_URL": moto_server.endpoint_url, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    reset_session()
    yield moto_server.endpoint_url
    moto_server.reset()
    reset_session()


#: The template's parameters for fixtures that only need its table, queues and bucket.
PARAMETERS = {"RedisUrl": "redis://redis.invalid:6379/0"}


@pytest.fixture(scope="session")
def translated_template() -> dict[str, object]:
    """template.yaml after the SAM transform (once per test process)."""
    return translate(load(), PARAMETERS)


@pytest.fixture
def template_resources(aws: str, translated_template: dict[str, object]) -> Created:
    """template.yaml created in moto (CreateStack: keys, indexes, redrive as the template declares
    them), the table, queues and bucket named ``jobs``, ``poll``, ``poll-dlq`` and ``results``."""
    names = {"JobsTable": "jobs", "PollQueue": "poll", "PollDeadLetterQueue": "poll-dlq", "ResultBucket": "results"}
    return create_stack(aws_clients(aws), translated_template, PARAMETERS, names=names)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fault-suite figures: each xdist worker leaves its rows; the controller writes the table."""
    import json
    import os

    from invariants import FIGURES, FIGURES_PATH, write_figures

    rows_dir = FIGURES_PATH.parent / "fault-figures.d"
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        if FIGURES:
            rows_dir.mkdir(parents=True, exist_ok=True)
            (rows_dir / f"{worker}.json").write_text(json.dumps(FIGURES))
        return
    for path in sorted(rows_dir.glob("*.json")) if rows_dir.exists() else []:
        FIGURES.extend(json.loads(path.read_text()))
        path.unlink()
    write_figures()
