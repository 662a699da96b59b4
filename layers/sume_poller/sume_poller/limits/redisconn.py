"""Redis as AWS runs it: standalone or cluster mode, TLS (``rediss://``), an ACL user.

ElastiCache Serverless speaks only TLS and cluster mode, with RBAC users: ``REDIS_MODE=cluster``,
a ``rediss://`` URL and ``REDIS_SECRET_NAME``. Every script the project runs touches one key
(or, on a standalone server, keys it may freely combine), so it runs unchanged on a cluster.

Two kinds of failure, told apart by :func:`failure`:

* **unavailable** - the connection failed (refused, timed out, a failover's ``READONLY`` or
  ``CLUSTERDOWN``, a server still loading): an outage. Callers carry on without Redis (the
  lease-less path) and count ``RedisUnavailable``;
* **misconfigured** - Redis answered, and refused the command: an ACL user without a command
  (``NOPERM``) or with a wrong password, ``MOVED``/``CROSSSLOT`` (``REDIS_MODE=standalone``
  pointed at a cluster endpoint), ``WRONGTYPE``, a script error. Nothing heals that but an
  operator: callers count ``RedisMisconfigured`` (its own alarm) and log Redis's message. At cold
  start :func:`check` finds these before any job is touched and fails the invocation loudly.

redis-py retries a command once after a connection error or timeout. That is safe here because
every lease and budget script is idempotent (a repeat finds its own value). After a failover,
:func:`reconnect` drops the pooled connections so the next command resolves the endpoint again;
:class:`Breaker` keeps a container from waiting on a dead Redis for every message.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis
from redis._parsers import Encoder
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.driver_info import DriverInfo
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    NoPermissionError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ..config.credentials import RedisCredentials
from ..config.settings import RedisSettings
from ..core.values import value

#: Every Redis failure a caller catches (then asks :func:`failure` which it is).
RedisFailure = (RedisError, RedisClusterException)
UNAVAILABLE = "RedisUnavailable"
MISCONFIGURED = "RedisMisconfigured"


class RedisMisconfigured(RuntimeError):
    """Redis answers but refuses what this project needs (raised by :func:`check` at cold start)."""


def failure(exc: BaseException) -> str:
    """:data:`UNAVAILABLE` for a failed connection, :data:`MISCONFIGURED` for a refused command."""
    if isinstance(exc, AuthenticationError | AuthorizationError):
        return MISCONFIGURED  # a wrong password or user: not an outage
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | BusyLoadingError | ReadOnlyError
                  | ClusterDownError | TryAgainError):
        return UNAVAILABLE
    if isinstance(exc, RedisClusterException):
        # redis-py's cluster client failing to map the slots: unreachable nodes, or not a cluster
        return MISCONFIGURED if "not enabled" in str(exc).lower() else UNAVAILABLE
    return MISCONFIGURED  # ResponseError and the rest: NOPERM, MOVED, CROSSSLOT, WRONGTYPE, Lua errors


def slow(exc: BaseException) -> bool:
    """A failure that cost its caller a timeout (a Redis that does not answer, rather than one that
    refuses the connection at once)."""
    return isinstance(exc, RedisTimeoutError) or "timeout" in str(exc).lower() or "timed out" in str(exc).lower()


def describe(exc: BaseException) -> dict[str, str]:
    """Log fields of a Redis failure: its class, and Redis's own message for a refused command
    (Redis's messages name commands and keys, never a password)."""
    fields = {"error": type(exc).__name__}
    if failure(exc) == MISCONFIGURED:
        fields["redis_message"] = str(exc)[:300]
    return fields


class LazyCluster:
    """A ``RedisCluster`` built on first use, and built again on the next use while that fails.

    redis-py's cluster client maps the slots when it is constructed and raises when no node
    answers, so a container that starts during an outage would fail every invocation until it
    is replaced. This stands in for it from the start: scripts register against it (they only
    need its encoder), and every other attribute is the real client's - while none can be built,
    a use raises ``ConnectionError``, which callers treat as Redis unavailable."""

    is_cluster = True

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._client: Any = None
        self._lock = threading.Lock()

    def register_script(self, script: str) -> Script:
        return Script(self, script)  # type: ignore[arg-type]  # it calls back only get_encoder and evalsha

    def get_encoder(self) -> Encoder:
        return Encoder("utf-8", "strict", True)  # type: ignore[no-untyped-call]  # decode_responses=True

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                try:
                    self._client = self._build()
                except RedisClusterException as exc:
                    if failure(exc) == MISCONFIGURED:
                        raise
                    raise RedisConnectionError(f"no Redis cluster node answers: {exc}") from exc
            return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client(), name)


#: A script file's header line naming one of its keys or arguments: ``-- KEYS[1] name: what it is``.
_HEADER = re.compile(r"^-- (KEYS|ARGV)\[(\d+)\] (\w+):", re.MULTILINE)


@value
class LuaScript:
    """A Lua script of this package, from its ``.lua`` file (read once, at import). The file opens
    with its KEYS and ARGV, one line each (``-- ARGV[2] mode: ...``, as redis-py's ``lock.py``
    documents its scripts); ``args`` are the ARGV names in order, and ``source`` - what Redis runs -
    is the libraries the script uses, a local per ARGV name (:func:`lua_locals`), then the file."""

    name: str
    source: str
    keys: tuple[str, ...]
    args: tuple[str, ...]

    def argv(self, values: Mapping[str, Any]) -> list[Any]:
        """The script's ARGV from named values (:func:`script_args`)."""
        return script_args(self.args, values)


def lua_file(package: str, name: str) -> str:
    """The text of the package's Lua file ``name``, shipped beside its modules in the layer's directory (read
    there: ``importlib.resources`` would import four modules to find it, about 3.5 M instructions of the
    cold start of every function that talks to Redis, bench figure 4)."""
    folder = os.path.dirname(str(importlib.import_module(package).__file__))
    with open(os.path.join(folder, name), encoding="utf-8") as file:
        return file.read()


def lua_script(package: str, name: str, libraries: str = "") -> LuaScript:
    """The script in the package's file ``name``, after ``libraries`` (Lua that defines the functions
    it calls). Raises ``ValueError`` when the header's KEYS or ARGV are not numbered 1, 2, ..."""
    text = lua_file(package, name)
    named: dict[str, list[tuple[int, str]]] = {"KEYS": [], "ARGV": []}
    for kind, number, field_name in _HEADER.findall(text):
        named[kind].append((int(number), field_name))
    for kind, entries in named.items():
        if [n for n, _ in entries] != list(range(1, len(entries) + 1)):
            raise ValueError(f"{name}: its header's {kind} are not numbered 1, 2, ... in order: {entries}")
    args = tuple(f for _, f in named["ARGV"])
    return LuaScript(name, libraries + lua_locals(args) + text, tuple(f for _, f in named["KEYS"]), args)


def lua_locals(names: tuple[str, ...], offset: int = 0) -> str:
    """Lua that names a script's arguments: ``local <name> = ARGV[<offset + i>]`` for each (Lua
    counts from 1). Scripts and their callers share one tuple of names (:func:`script_args`), so
    no argument is ever addressed by a bare position."""
    return "".join(f"local {name} = ARGV[{offset + i + 1}]\n" for i, name in enumerate(names))


def script_args(names: tuple[str, ...], values: Mapping[str, Any]) -> list[Any]:
    """A script's ARGV from named values, in the order of ``names``."""
    return [values[name] for name in names]


def connect(settings: RedisSettings) -> Any:
    """A client for ``settings`` (``redis.Redis``, or a :class:`LazyCluster` of ``RedisCluster``)."""
    options: dict[str, Any] = {
        "socket_timeout": settings.timeout_real,
        "socket_connect_timeout": settings.timeout_real,
        "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError, RedisTimeoutError)),
        "decode_responses": True,
        # What CLIENT SETINFO reports, as redis-py would say it; given, because redis-py otherwise
        # asks importlib.metadata for its own version at the first connection (it imports the email
        # parser and reads the dist-info dirs on sys.path): about 2 ms of CPU of every cold start.
        "driver_info": DriverInfo(lib_version=redis.__version__),
    }
    if settings.secret_name:
        options["credential_provider"] = RedisCredentials(settings.secret_name)
    if settings.mode == "cluster":
        return LazyCluster(lambda: RedisCluster.from_url(settings.url, **options))
    return redis.Redis.from_url(settings.url, health_check_interval=30, max_connections=32, **options)


def check(client: Any, mode: str, probe: Callable[[], None]) -> None:
    """The cold-start check: Redis answers, the mode matches the endpoint and ``probe`` (one run of
    the scripts the function uses, on keys of its own) passes. Raises :class:`RedisMisconfigured`
    with Redis's message for anything an operator must fix; an unreachable Redis is an outage,
    not a misconfiguration, and is left to the callers (the check runs again on the next call)."""
    try:
        client.ping()
        if mode == "standalone":
            try:
                info = client.execute_command("CLUSTER", "INFO")
            except NoPermissionError:
                pass  # the ACL user may not ask: the probe's two-key script fails on a cluster anyway
            except ResponseError as exc:  # "cluster support disabled": a standalone server, as configured
                if "disabled" not in str(exc):
                    raise
            else:  # a cluster node answers with its state (a dict once redis-py has parsed it)
                if "cluster_state" in (info if isinstance(info, dict) else str(info)):
                    raise RedisMisconfigured("REDIS_MODE=standalone, but the Redis endpoint is a cluster: "
                                             "deploy with RedisMode=cluster")
        probe()
    except RedisMisconfigured:
        raise
    except RedisFailure as exc:
        if failure(exc) == MISCONFIGURED:
            raise RedisMisconfigured(f"Redis refused a command this function needs ({type(exc).__name__}: "
                                     f"{str(exc)[:300]}); see docs/deploy.md, 'The Redis user': the ACL rule and "
                                     "RedisMode") from exc
        raise


def reconnect(client: Any, error: BaseException) -> None:
    """After a failover (READONLY) drop pooled connections, so the next command reconnects."""
    if not isinstance(error, ReadOnlyError):
        return
    try:
        pool = getattr(client, "connection_pool", None)
    except RedisFailure:  # a LazyCluster without a client: nothing pooled
        return
    if pool is not None:
        pool.disconnect()


class ColdStartCheck:
    """:func:`check` until it passes once in this container. A misconfiguration raises (the
    invocation fails loudly; the caller counts ``RedisMisconfigured``); an unreachable Redis is
    left to the outage path, and the check runs again on the next invocation."""

    def __init__(self, client: Any, mode: str, probe: Callable[[], None]) -> None:
        self.client, self.mode, self.probe = client, mode, probe
        self.passed = False

    def __call__(self) -> None:
        if self.passed:
            return
        try:
            check(self.client, self.mode, self.probe)
        except RedisMisconfigured:
            raise
        except RedisFailure:
            return
        self.passed = True


class Breaker:
    """After Redis timed out, callers skip it for ``open_for`` real seconds: a container does not
    wait for a dead Redis's timeouts on every message of an outage, and finds it again within that
    time once it is back. (A refused connection costs nothing to retry: it does not trip it, so no
    message of a container goes without the lease once Redis answers again.)"""

    def __init__(self, open_for: float = 2.0, now: Callable[[], float] = time.monotonic) -> None:
        self.open_for = open_for
        self._now = now
        self._until = 0.0
        self._lock = threading.Lock()

    @property
    def open(self) -> bool:
        return self._now() < self._until

    def trip(self) -> None:
        with self._lock:
            self._until = self._now() + self.open_for
