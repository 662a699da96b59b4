"""settings.py's cold-start checks of what a deploy got wrong (issue "Real-account truth, round
two"): an ElastiCache Redis from outside a VPC, a compressed clock on AWS, a claim that outlives
the poll queue's visibility timeout."""

from __future__ import annotations

import pytest

from sume_poller.config import settings
from sume_poller.config.settings import ConfigError
from sume_poller.poll.fanout import FanOutSettings
from sume_poller.poll.poller import PollSettings

POLL = {"JOBS_TABLE": "jobs", "POLL_QUEUE_URL": "q", "RESULT_BUCKET": "b", "SUME_BASE_URL": "https://sume.test/api/v1",
        "SUME_API_KEY_NAME": "/k", "REDIS_URL": "rediss://cache.example:6379"}
ELASTICACHE = "rediss://sume-abc123.serverless.use1.cache.amazonaws.com:6379"


def test_an_elasticache_redis_outside_a_vpc_fails_the_cold_start() -> None:
    for env in ({**POLL, "REDIS_URL": ELASTICACHE}, {**POLL, "REDIS_URL": ELASTICACHE, "IN_VPC": "false"}):
        with pytest.raises(ConfigError, match="ElastiCache is reachable only inside its VPC: set SubnetIds and "
                                              "SecurityGroupIds"):
            FanOutSettings.from_env(env)
    assert PollSettings.from_env({**POLL, "REDIS_URL": ELASTICACHE, "IN_VPC": "true"}).redis.url == ELASTICACHE
    assert FanOutSettings.from_env({**POLL, "REDIS_URL": ELASTICACHE, "LOCAL_ENDPOINTS": "true"})
    assert FanOutSettings.from_env(POLL)  # another Redis: its reachability is not known here


def test_a_compressed_clock_needs_local_endpoints() -> None:
    with pytest.raises(ConfigError, match=r"TIME_SCALE 0\.05 compresses the clock: only with LOCAL_ENDPOINTS=true"):
        PollSettings.from_env({**POLL, "TIME_SCALE": "0.05"})
    assert PollSettings.from_env({**POLL, "TIME_SCALE": "0.05", "LOCAL_ENDPOINTS": "true"}).common.clock.scale == 0.05
    assert PollSettings.from_env({**POLL, "TIME_SCALE": "1"}).common.clock.scale == 1.0


def test_the_claim_ttl_expires_before_sqs_delivers_a_crashed_message_again() -> None:
    assert settings.CLAIM_TTL_MAX_SECONDS == 150 == (
        settings.POLL_QUEUE_VISIBILITY_TIMEOUT_SECONDS - settings.POLL_FUNCTION_TIMEOUT_SECONDS)
    assert PollSettings.from_env({**POLL, "CLAIM_TTL_SECONDS": "150"}).lease.claim_ttl == 150
    with pytest.raises(ConfigError, match="CLAIM_TTL_SECONDS must be between 1 and 150, not 151"):
        PollSettings.from_env({**POLL, "CLAIM_TTL_SECONDS": "151"})
