"""Settings (settings.py): each function reads what it needs, once, and a bad environment fails
the cold start with every problem named."""

from __future__ import annotations

import importlib
import pkgutil
from typing import get_type_hints

import pytest

import sume_poller
from sume_poller.config.settings import ConfigError, FunctionSettings, Group, groups
from sume_poller.creates.submit import SubmitSettings
from sume_poller.poll.fanout import FanOutSettings
from sume_poller.poll.poller import PollSettings

POLL = {"JOBS_TABLE": "jobs", "POLL_QUEUE_URL": "q", "RESULT_BUCKET": "b", "SUME_BASE_URL": "https://sume.test/api/v1",
        "SUME_API_KEY_NAME": "/k", "REDIS_URL": "rediss://cache.example:6379"}


def test_each_function_gets_its_own_settings() -> None:
    poll = PollSettings.from_env(POLL)
    assert poll.redis.url == "rediss://cache.example:6379" and poll.budget.reads_per_minute == 120
    fanout = FanOutSettings.from_env({**POLL, "FANOUT_PERIOD_MINUTES": "5"})
    assert fanout.period == 300
    submit = SubmitSettings.from_env(POLL)
    assert submit.budget.creates_per_minute == 10


def test_every_problem_is_named_once() -> None:
    env = {**POLL, "SUME_BASE_URL": "http://sume.test", "REDIS_URL": "redis://127.0.0.1:6379", "PENDING_SHARDS": "0",
           "READS_PER_MINUTE": "lots", "JOBS_TABLE": ""}
    with pytest.raises(ConfigError) as caught:
        PollSettings.from_env(env)
    text = str(caught.value)
    for needle in ("JOBS_TABLE is required", "SUME_BASE_URL must be an https URL", "loopback Redis",
                   "PENDING_SHARDS must be between 1 and 64", "READS_PER_MINUTE must be an integer"):
        assert text.count(needle) == 1, (needle, text)


def test_local_endpoints_allow_a_local_simulator_and_redis() -> None:
    env = {**POLL, "SUME_BASE_URL": "http://127.0.0.1:8787/api/v1", "REDIS_URL": "redis://127.0.0.1:6379",
           "LOCAL_ENDPOINTS": "true", "TIME_SCALE": "0.01"}
    settings = PollSettings.from_env(env)
    assert settings.common.clock.scale == 0.01


def test_credentials_never_ride_in_the_redis_url() -> None:
    with pytest.raises(ConfigError, match="must not carry credentials"):
        PollSettings.from_env({**POLL, "REDIS_URL": "rediss://user:secret@cache.example:6379"})


def test_the_claim_ttl_must_outlast_a_sume_request() -> None:
    with pytest.raises(ConfigError, match="CLAIM_TTL_SECONDS must outlast"):
        PollSettings.from_env({**POLL, "CLAIM_TTL_SECONDS": "10"})


def _subclasses(cls: type) -> list[type]:
    return [cls, *(sub for direct in cls.__subclasses__() for sub in _subclasses(direct))]


def test_the_groups_are_what_get_type_hints_resolves() -> None:
    """from_env finds each function's groups without evaluating every annotation: the same fields and groups."""
    for module in pkgutil.walk_packages(sume_poller.__path__, "sume_poller."):
        importlib.import_module(module.name)
    classes = _subclasses(FunctionSettings)
    assert len(classes) >= 7  # the base, the readers' base and the five functions'
    for cls in classes:
        hinted = {name: hint for name, hint in get_type_hints(cls).items()
                  if isinstance(hint, type) and issubclass(hint, Group)}
        assert groups(cls) == hinted and hinted, cls
