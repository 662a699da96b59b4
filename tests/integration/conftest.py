"""Fixtures of the integration tier: real redis-server and moto server, started by the tests themselves."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

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


@pytest.fixture
def grants(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[float]]]:
    """Where the limiter's read log counts every read it granted now, per budget (its Redis key, which
    names its Sume key): each grant's ``logged_at`` (its clock, s), once for each slot its take asked
    for. The stack's functions run in this process; a take's arguments and its reply are built on the
    same thread. Count a budget here, not where Sume counts: on a compressed clock a real second of a
    loaded machine between a grant and its request is many clock seconds, which can carry a read granted
    at a window's end into Sume's next one - a 429 of the machine's speed, not of the limiter's."""
    from sume_poller.limits.budget import Budget, Grant

    times: defaultdict[str, list[float]] = defaultdict(list)
    asked = threading.local()
    take_values, from_reply = Budget.take_values, Grant.from_reply.__func__  # type: ignore[attr-defined]

    def noting_take_values(self: Budget, *args: Any, **kwargs: Any) -> dict[str, Any]:
        values = take_values(self, *args, **kwargs)
        asked.count, asked.budget = values["count"], self.key
        return values

    def noting_from_reply(cls: type[Grant], reply: list[Any]) -> Grant:
        grant = from_reply(cls, reply)
        if grant.now:
            assert grant.logged_at is not None, grant
            times[asked.budget].extend([grant.logged_at] * asked.count)
        return grant

    monkeypatch.setattr(Budget, "take_values", noting_take_values)
    monkeypatch.setattr(Grant, "from_reply", classmethod(noting_from_reply))
    yield times


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
