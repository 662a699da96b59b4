"""Local services for tests, the demo and CI: redis-server and moto server as child processes.

Each service runs in the foreground as a child of this process on a free 127.0.0.1 port, is
polled until it answers (with a deadline, no fixed sleeps), and is stopped by its PID only:
SIGTERM, then SIGKILL if it has not exited by a deadline. Every started service is also stopped
at interpreter exit. Use them as context managers::

    with RedisServer() as redis, MotoServer() as moto:
        ...  # redis.url, moto.endpoint_url

Redis comes in the shapes AWS runs it: open (:class:`RedisServer`), with an AUTH token
(``RedisServer(password=...)``), with an ACL user and the default user disabled (ElastiCache
RBAC: ``RedisServer(acl_user=(name, password))``), and in cluster mode (:class:`RedisCluster`,
like ElastiCache cluster mode and Serverless). URLs never carry credentials; ``.credentials``
gives them.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, BinaryIO, Self

__all__ = [
    "HttpService",
    "MotoServer",
    "RedisCluster",
    "RedisServer",
    "ServiceError",
    "free_port",
    "running_services",
]

READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
_POLL_INTERVAL_S = 0.05
_TAIL_BYTES = 4000


class ServiceError(RuntimeError):
    """A local service could not be found, started or reached."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_in_use(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


_live: set[_Service] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        services = list(_live)
    for service in services:
        service.stop()


class Lifecycle:
    """``start()``/``stop()`` and their context manager."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class _Service(Lifecycle):
    """A child process on ``127.0.0.1:port`` with a readiness probe."""

    name = "service"

    def __init__(self, port: int | None = None, ready_timeout: float = READY_TIMEOUT_S) -> None:
        self.port = port or free_port()
        self.ready_timeout = ready_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # -- to provide -----------------------------------------------------------------------------

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _probe(self) -> bool:
        """True once the service answers."""
        raise NotImplementedError

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """PID of the running child, None when stopped."""
        return self._process.pid if self.running else None  # type: ignore[union-attr]

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> Self:
        """Start the child and wait until it answers; no-op if it is already running."""
        if self.running:
            return self
        command = self._command()
        if _port_in_use(self.port):
            raise ServiceError(f"cannot start {self.name}: 127.0.0.1:{self.port} is already in use")
        self._log = tempfile.TemporaryFile(prefix=f"{self.name}-")  # noqa: SIM115 - closed in stop()
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self._cwd(),
        )
        with _live_lock:
            _live.add(self)
        try:
            self._wait_ready(command)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the child by PID: SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``."""
        process, self._process = self._process, None
        with _live_lock:
            _live.discard(self)
        if process is not None and process.poll() is None:
            try:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> Self:
        """Stop and start again on the same port (e.g. to simulate an outage)."""
        self.stop()
        return self.start()

    def output_tail(self, limit: int = _TAIL_BYTES) -> str:
        """Last ``limit`` bytes the child wrote to stdout/stderr."""
        if self._log is None:
            return ""
        self._log.flush()
        size = self._log.seek(0, os.SEEK_END)
        self._log.seek(max(0, size - limit))
        data = self._log.read()
        self._log.seek(0, os.SEEK_END)
        return data.decode(errors="replace")

    def _cwd(self) -> str | None:
        return None

    def _wait_ready(self, command: list[str]) -> None:
        deadline = time.monotonic() + self.ready_timeout
        assert self._process is not None
        while True:
            code = self._process.poll()
            if code is not None:
                raise ServiceError(
                    f"{self.name} exited with code {code} before answering on port {self.port}\n"
                    f"command: {' '.join(command)}\noutput tail:\n{self.output_tail()}"
                )
            if self._probe():
                return
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"{self.name} did not answer on 127.0.0.1:{self.port} within {self.ready_timeout:g} s\n"
                    f"command: {' '.join(command)}\noutput tail:\n{self.output_tail()}"
                )
            time.sleep(_POLL_INTERVAL_S)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(port={self.port}, pid={self.pid})"


def _find_redis_binary(name: str = "redis-server") -> str:
    found = shutil.which(name)
    if found:
        return found
    for directory in ("/usr/bin", "/usr/sbin", "/usr/local/bin"):
        candidate = f"{directory}/{name}"
        if os.access(candidate, os.X_OK):
            return candidate
    raise ServiceError(
        f"{name} binary not found on PATH. Install it with `apt-get install redis-server` "
        "(Debian/Ubuntu; run `apt-get update` first) or `brew install redis` (macOS)."
    )


#: (username, password) for AUTH; username None means ``AUTH <password>`` (the default user).
Credentials = tuple[str | None, str]


class _RedisReplyError(Exception):
    """The server answered a probe with an error (-NOAUTH, -LOADING, ...)."""


def _resp(args: Sequence[str]) -> bytes:
    """One command in RESP: an array of bulk strings."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _read_reply(reader: BinaryIO) -> bytes:
    """One scalar reply (simple string, integer or bulk string) of the probes' commands."""
    line = reader.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed")
    kind, body = line[:1], line[1:-2]
    if kind == b"-":
        raise _RedisReplyError(body.decode(errors="replace"))
    if kind != b"$":
        return body
    size = int(body)
    return b"" if size < 0 else reader.read(size + 2)[:-2]


def _redis_call(port: int, credentials: Credentials | None, *commands: Sequence[str]) -> list[bytes] | None:
    """Replies to ``commands`` sent on one new connection (after AUTH when ``credentials`` are
    given); None when the server cannot be reached or answers any of them with an error."""
    if credentials is not None:
        username, password = credentials
        commands = (["AUTH", password] if username is None else ["AUTH", username, password], *commands)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock, sock.makefile("rb") as reader:
            sock.sendall(b"".join(_resp(command) for command in commands))
            replies = [_read_reply(reader) for _ in commands]
    except (OSError, ValueError, _RedisReplyError):
        return None
    return replies[1:] if credentials is not None else replies


def _acl_rule(password: str) -> str:
    """An ACL password rule by its SHA-256 (``#<hex>``): no quoting, no plain text on disk."""
    return "#" + hashlib.sha256(password.encode()).hexdigest()


class RedisServer(_Service):
    """``redis-server`` on 127.0.0.1 without persistence; ``.url`` is ``redis://127.0.0.1:P/0``.

    ``password`` makes the default user need it (``AUTH <password>``: requirepass, ElastiCache's
    AUTH token). ``acl_user=(username, password)`` adds a user with full access and disables the
    default user (ElastiCache RBAC). ``.url`` never carries them; clients use ``.credentials``.
    The users are written to a config file in the server's temporary directory.
    """

    name = "redis-server"

    def __init__(
        self,
        port: int | None = None,
        ready_timeout: float = READY_TIMEOUT_S,
        *,
        password: str | None = None,
        acl_user: tuple[str, str] | None = None,
    ) -> None:
        if password is not None and acl_user is not None:
            raise ValueError("give password (default user) or acl_user (default user disabled), not both")
        if acl_user is not None and (not acl_user[0] or acl_user[0].split() != [acl_user[0]]):
            raise ValueError(f"ACL user name must be one word, got {acl_user[0]!r}")
        super().__init__(port, ready_timeout)
        self.password = password
        self.acl_user = acl_user
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def credentials(self) -> Credentials | None:
        """(username, password) to AUTH with: (None, password) for the default user, None when open."""
        if self.acl_user is not None:
            return self.acl_user
        return None if self.password is None else (None, self.password)

    def _directory(self) -> Path:
        # Its working directory is where it would write dump files: keep it out of the repo.
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="redis-")
        return Path(self._dir.name)

    def _users_config(self) -> str:
        """Config file lines for the users (empty when open)."""
        if self.acl_user is not None:
            username, password = self.acl_user
            return f"user default off\nuser {username} on {_acl_rule(password)} ~* &* +@all\n"
        if self.password is not None:  # what requirepass does, by hash
            return f"user default on {_acl_rule(self.password)} ~* &* +@all\n"
        return ""

    def _command(self) -> list[str]:
        binary = _find_redis_binary()
        config = self._directory() / "users.conf"
        config.write_text(self._users_config(), encoding="utf-8")
        config.chmod(0o600)
        return [
            binary, str(config),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
        ]  # fmt: skip

    def _cwd(self) -> str:
        return str(self._directory())

    def _probe(self) -> bool:
        """PING answers (authenticated), and INFO says the server is our child (not another on the port)."""
        replies = _redis_call(self.port, self.credentials, ["PING"], ["INFO", "server"])
        if replies is None or replies[0] != b"PONG" or b"process_id:" not in replies[1]:
            return False
        pid = replies[1].split(b"process_id:", 1)[1].split(b"\r\n", 1)[0].strip()
        return self._process is not None and pid == str(self._process.pid).encode()

    def stop(self) -> None:
        super().stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


class _ClusterNode(RedisServer):
    """One master of a :class:`RedisCluster`: cluster mode, its own cluster bus port."""

    name = "redis-server (cluster node)"

    def __init__(self, password: str | None, ready_timeout: float) -> None:
        super().__init__(ready_timeout=ready_timeout, password=password)
        # Set explicitly: the default (port + 10000) may be taken or above 65535.
        self.bus_port = free_port()

    @property
    def nodes_file(self) -> Path:
        return self._directory() / f"nodes-{self.port}.conf"

    def _command(self) -> list[str]:
        return [
            *super()._command(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.nodes_file),
            "--cluster-port", str(self.bus_port),
        ]  # fmt: skip


class RedisCluster(Lifecycle):
    """``masters`` redis-server nodes in cluster mode without replicas, joined with
    ``redis-cli --cluster create``: the shape of ElastiCache cluster mode (and Serverless).

    Ready when ``CLUSTER INFO`` says ``cluster_state:ok`` on every node. ``.url`` is the first
    node (cluster clients discover the others); ``.nodes`` lists every ``(host, port)``.
    """

    def __init__(self, masters: int = 3, password: str | None = None, ready_timeout: float = READY_TIMEOUT_S) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.password = password
        self.ready_timeout = ready_timeout
        self.servers: list[RedisServer] = [_ClusterNode(password, ready_timeout) for _ in range(masters)]

    @property
    def nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", server.port) for server in self.servers]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.servers[0].port}"

    @property
    def credentials(self) -> Credentials | None:
        return None if self.password is None else (None, self.password)

    @property
    def running(self) -> bool:
        return all(server.running for server in self.servers)

    def start(self) -> Self:
        """Start every node, create the cluster and wait until every node says it is ok."""
        if self.running:
            return self
        try:
            for server in self.servers:
                server.start()
            self._create()
            self._wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node (by PID) and remove its files (nodes-<port>.conf included)."""
        for server in self.servers:
            server.stop()

    def _create(self) -> None:
        command = [
            _find_redis_binary("redis-cli"), "--cluster", "create",
            *(f"{host}:{port}" for host, port in self.nodes),
            "--cluster-replicas", "0", "--cluster-yes",
        ]  # fmt: skip
        # REDISCLI_AUTH is redis-cli's -a without the password in the process list (or its warning).
        env = {**os.environ, "REDISCLI_AUTH": self.password} if self.password is not None else None
        try:
            result = subprocess.run(
                command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                timeout=self.ready_timeout, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as error:
            raise ServiceError(f"{' '.join(command)} did not finish within {self.ready_timeout:g} s") from error
        if result.returncode != 0:
            raise ServiceError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        expected = f"cluster_known_nodes:{len(self.servers)}".encode()
        while True:
            infos = [_redis_call(port, self.credentials, ["CLUSTER", "INFO"]) for _, port in self.nodes]
            if all(info is not None and b"cluster_state:ok" in info[0] and expected in info[0] for info in infos):
                return
            if time.monotonic() > deadline:
                raise ServiceError(f"cluster {self.nodes} not ok within {self.ready_timeout:g} s: {infos}")
            time.sleep(_POLL_INTERVAL_S)

    def __repr__(self) -> str:
        return f"RedisCluster(nodes={self.nodes}, running={self.running})"


#: moto's server, with one change: its dispatcher lists moto's package directory on every request
#: to tell a backend's name (``list_of_moto_modules``: ~150 stat calls, about a tenth of the
#: server's CPU in the test runs); the listing cannot change while the server runs, so it is read once.
_MOTO_MAIN = ("import functools, moto.backends as b; "
              "b.list_of_moto_modules = functools.cache(lambda listing=b.list_of_moto_modules: tuple(listing())); "
              "from moto.server import main; main()")


def _moto_server_command() -> list[str]:
    if importlib.util.find_spec("moto") is not None:
        return [sys.executable, "-c", _MOTO_MAIN]
    found = shutil.which("moto_server")
    if found:
        return [found]
    raise ServiceError("moto is not installed here: run make setup")


class HttpService(_Service):
    """A service that answers HTTP on ``endpoint_url`` (moto, ministack)."""

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _request(self, method: str, path: str, timeout: float, quiet: bool) -> bool:
        data = b"" if method == "POST" else None
        request = urllib.request.Request(self.endpoint_url + path, method=method, data=data)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return 200 <= int(response.status) < 300
        except (urllib.error.URLError, OSError) as error:
            if quiet:
                return False
            raise ServiceError(f"{method} {self.endpoint_url}{path} failed: {error}") from error


class MotoServer(HttpService):
    """``moto_server`` (all AWS services over HTTP); ``.endpoint_url`` is ``http://127.0.0.1:P``."""

    name = "moto_server"

    def _command(self) -> list[str]:
        return [*_moto_server_command(), "-H", "127.0.0.1", "-p", str(self.port)]

    def _probe(self) -> bool:
        return self._request("GET", "/moto-api/", timeout=1.0, quiet=True)

    def reset(self) -> None:
        """Forget every resource moto holds (POST /moto-api/reset)."""
        if not self._request("POST", "/moto-api/reset", timeout=10.0, quiet=False):
            raise ServiceError(f"moto reset failed on {self.endpoint_url}")


def running_services() -> list[_Service]:
    """Services started by this process and not yet stopped (for diagnostics)."""
    with _live_lock:
        return list(_live)
