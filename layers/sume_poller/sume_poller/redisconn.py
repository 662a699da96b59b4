"""Redis as AWS runs it: standalone or cluster mode, TLS (``rediss://``), an ACL user.

ElastiCache Serverless speaks only TLS and cluster mode, with RBAC users: ``REDIS_MODE=cluster``,
a ``rediss://`` URL and ``REDIS_SECRET_NAME``. Every script the project runs touches one key
(or, on a standalone server, keys it may freely combine), so it runs unchanged on a cluster.

redis-py retries a command once after a connection error or timeout. That is safe here because
every lease and budget script is idempotent (a repeat finds its own value). ``READONLY`` - what a
client sees on a connection to a node that a failover demoted - is treated as Redis being
unavailable: :func:`reconnect` drops the pooled connections so the next command resolves the
endpoint again.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from .credentials import RedisCredentials
from .settings import RedisSettings

#: Every Redis failure a caller treats as "Redis unavailable".
RedisUnavailable = RedisError


def connect(settings: RedisSettings) -> Any:
    """A client for ``settings`` (``redis.Redis`` or ``redis.cluster.RedisCluster``)."""
    options: dict[str, Any] = {
        "socket_timeout": settings.timeout_real,
        "socket_connect_timeout": settings.timeout_real,
        "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError, RedisTimeoutError)),
        "decode_responses": True,
    }
    if settings.secret_name:
        options["credential_provider"] = RedisCredentials(settings.secret_name)
    if settings.mode == "cluster":
        return RedisCluster.from_url(settings.url, **options)
    return redis.Redis.from_url(settings.url, health_check_interval=30, max_connections=32, **options)


def reconnect(client: Any, error: BaseException) -> None:
    """After a failover (READONLY) drop pooled connections, so the next command reconnects."""
    if not isinstance(error, ReadOnlyError):
        return
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.disconnect()
