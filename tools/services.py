"""Local services for tests, the demo and CI - ``with RedisServer() as redis, MotoServer() as moto`` (``redis.url``,
``moto.endpoint_url``) - run by mirakuru: each on a free 127.0.0.1 port (a port already taken is refused), ready
once it accepts connections (with a deadline), stopped by its process group (SIGTERM, then SIGKILL), killed at
interpreter exit; its output quoted if it fails to start. What mirakuru does not know, kept here: Redis in the
shapes AWS runs it - an AUTH token, an ACL user with the default user disabled (ElastiCache RBAC), cluster mode
(:class:`RedisCluster`, joined with ``redis-cli --cluster create``); URLs never carry credentials, ``.credentials``
gives them.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import IO, Any, Self

from mirakuru import TCPExecutor
from mirakuru import base as mirakuru_base
from mirakuru.base import ENV_UUID
from mirakuru.base_env import processes_with_env
from mirakuru.exceptions import AlreadyRunning, ProcessExitedWithError, TimeoutExpired

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 20.0
#: (username, password) for AUTH; username None means ``AUTH <password>`` (the default user).
Credentials = tuple[str | None, str]


class ServiceError(RuntimeError):
    """A local service could not be found, started or reached."""


#: Where :func:`free_port` looks when the kernel's ephemeral range cannot be read (Linux's default starts at 32768).
EPHEMERAL_LOW_DEFAULT = 32768
#: The lowest port :func:`free_port` hands out (above the registered services most machines run).
PORT_FLOOR = 15000
#: The OS's randomness: a test or the simulation seeding ``random`` must not make two processes pick alike.
_RANDOM = random.SystemRandom()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (``ip_local_port_range``)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW_DEFAULT


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, chosen at random below the kernel's ephemeral range: a port
    the OS hands out (bind to port 0) is one any outbound connection of the run may take between this check and
    the service's bind (a loaded CI run's moto met another server there); below the range only a bind takes one.
    The OS picks when no port there is free (or the range starts too low to leave room)."""
    low = _ephemeral_low()
    if low - PORT_FLOOR >= 1000:
        for _ in range(50):
            port = _RANDOM.randrange(PORT_FLOOR, low)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _letters(digits: str) -> str:
    """Hex digits as letters (0-f as g-v)."""
    return "".join(chr(ord("g") + int(c, 16)) for c in digits)


def _marker() -> str:
    """The start of the mirakuru markers of the services this process starts (see :class:`Service`)."""
    return f"sume-{_letters(str(os.getpid()))}:"


def _kill_leftovers() -> None:
    """At exit, what mirakuru's own exit hook was for: SIGKILL to every process that carries a marker of a
    service this process started (a test process that dies without stopping its services)."""
    for pid in processes_with_env(ENV_UUID, _marker()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


# mirakuru's exit hook SIGKILLs every process whose marker *contains* the exiting process's pid (psutil's
# search is a substring test): a process of pid 3015 that exits kills the services of processes 30150-30159,
# 13015, ... and of any whose marker's uuid holds those digits (a loaded CI run's moto died of it mid-test). A
# Service's marker holds no digit ("sume-<pid as letters>:<uuid as letters>"), so no pid matches it; this
# process's own hook kills this process's own.
atexit.unregister(mirakuru_base.cleanup_subprocesses)
atexit.register(_kill_leftovers)


class Service(TCPExecutor):  # type: ignore[misc]
    """A child process on ``127.0.0.1:port``, ready once it accepts connections; start-up failures are a
    :class:`ServiceError` with the end of its output. Its mirakuru marker (the environment variable by which
    mirakuru finds what it started) is ``sume-<this pid>:<uuid>`` written in letters, not mirakuru's
    ``<pid>:<uuid>``: see :func:`_kill_leftovers`."""

    name = "service"

    def __init__(self, command: list[str], port: int | None = None, ready_timeout: float = READY_TIMEOUT_S,
                 cwd: str | None = None, env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self._log: IO[str] = tempfile.TemporaryFile("w+", prefix=f"{self.name}-")  # noqa: SIM115 - closed with self
        super().__init__(command, host="127.0.0.1", port=self.port, timeout=ready_timeout, sleep=0.05, cwd=cwd,
                         envvars=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        self._uuid = f"{_marker()}{_letters(uuid.uuid4().hex)}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.running() else None

    def start(self) -> Self:
        if self.running():
            return self
        try:
            super().start()
        except AlreadyRunning as error:
            raise ServiceError(f"cannot start {self.name}: 127.0.0.1:{self.port} is already in use") from error
        except (ProcessExitedWithError, TimeoutExpired) as error:
            what = (f"exited with code {error.exit_code}" if isinstance(error, ProcessExitedWithError)
                    else f"did not answer within {self._timeout:g} s")
            self._log.flush()
            self._log.seek(0)
            raise ServiceError(f"{self.name} {what} on port {self.port}\ncommand: {' '.join(self.command_parts)}\n"
                               f"output tail:\n{self._log.read()[-4000:]}") from error
        return self

    def stop(self, *args: Any, **kwargs: Any) -> Self:
        if self.process is not None:
            super().stop(*args, **kwargs)
        return self

    def restart(self) -> Self:
        """Stop and start again on the same port (e.g. to simulate an outage)."""
        return self.stop().start()


def _binary(name: str) -> str:
    found = shutil.which(name) or next((f"{d}/{name}" for d in ("/usr/bin", "/usr/sbin", "/usr/local/bin")
                                        if os.access(f"{d}/{name}", os.X_OK)), None)
    if found is None:
        raise ServiceError(f"{name} binary not found on PATH. Install it with `apt-get install redis-server` "
                           "(Debian/Ubuntu; run `apt-get update` first) or `brew install redis` (macOS).")
    return found


def _acl_rule(password: str) -> str:
    """An ACL password rule by its SHA-256 (``#<hex>``): no quoting, no plain text on disk."""
    return "#" + hashlib.sha256(password.encode()).hexdigest()


class RedisServer(Service):
    """``redis-server`` on 127.0.0.1 without persistence; ``.url`` is ``redis://127.0.0.1:P/0``. ``password``: the
    default user needs it (ElastiCache's AUTH token). ``acl_user=(name, password)``: a user with full access, the
    default user disabled (ElastiCache RBAC). The users go to a config file in the server's temporary directory (its
    working directory too: no dump file lands here)."""

    name = "redis-server"

    def __init__(self, port: int | None = None, ready_timeout: float = READY_TIMEOUT_S, *,
                 password: str | None = None, acl_user: tuple[str, str] | None = None,
                 cluster: bool = False, extra: list[str] | None = None) -> None:
        if password is not None and acl_user is not None:
            raise ValueError("give password (default user) or acl_user (default user disabled), not both")
        if acl_user is not None and (not acl_user[0] or acl_user[0].split() != [acl_user[0]]):
            raise ValueError(f"ACL user name must be one word, got {acl_user[0]!r}")
        self.password, self.acl_user = password, acl_user
        #: (username, password) to AUTH with: (None, password) for the default user, None when open.
        self.credentials: Credentials | None = acl_user if acl_user is not None else (
            None if password is None else (None, password))
        self._dir = tempfile.TemporaryDirectory(prefix="redis-")
        self.directory = Path(self._dir.name)
        users = ""
        if acl_user is not None:
            users = f"user default off\nuser {acl_user[0]} on {_acl_rule(acl_user[1])} ~* &* +@all\n"
        elif password is not None:  # what requirepass does, by hash
            users = f"user default on {_acl_rule(password)} ~* &* +@all\n"
        config = self.directory / "users.conf"
        config.write_text(users, encoding="utf-8")
        config.chmod(0o600)
        port = port or free_port()
        if cluster:  # a cluster node; its bus port set too (port + 10000 may be taken or over 65535), never its port
            extra = ["--cluster-enabled", "yes", "--cluster-config-file", f"{self._dir.name}/nodes-{port}.conf",
                     "--cluster-port", str(next(p for p in iter(free_port, None) if p != port)), *(extra or [])]
        super().__init__([_binary("redis-server"), str(config), "--port", str(port), "--bind", "127.0.0.1",
                          "--save", "", "--appendonly", "no", "--daemonize", "no", *(extra or [])],
                         port, ready_timeout, cwd=self._dir.name)
        self.url = f"redis://127.0.0.1:{self.port}/0"


class RedisCluster:
    """``masters`` redis-server nodes in cluster mode without replicas, joined with ``redis-cli --cluster create``: the
    shape of ElastiCache cluster mode (and Serverless). Ready when ``CLUSTER INFO`` says ``cluster_state:ok`` on
    every node. ``.url`` is the first node (cluster clients discover the others); ``.nodes`` lists every ``(host,
    port)``."""

    def __init__(self, masters: int = 3, password: str | None = None, ready_timeout: float = READY_TIMEOUT_S) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.password = password
        self.credentials: Credentials | None = None if password is None else (None, password)
        self.ready_timeout = ready_timeout
        self.servers = [RedisServer(ready_timeout=ready_timeout, password=password, cluster=True)
                        for _ in range(masters)]
        self.nodes = [("127.0.0.1", server.port) for server in self.servers]
        self.url = f"redis://127.0.0.1:{self.servers[0].port}"

    def running(self) -> bool:
        return all(server.running() for server in self.servers)

    def start(self) -> Self:
        """Start every node, create the cluster and wait until every node says it is ok."""
        if self.running():
            return self
        try:
            for server in self.servers:
                server.start()
            command = [_binary("redis-cli"), "--cluster", "create", *(f"{h}:{p}" for h, p in self.nodes),
                       "--cluster-replicas", "0", "--cluster-yes"]
            # REDISCLI_AUTH is redis-cli's -a without the password in the process list (or its warning).
            env = {**os.environ, "REDISCLI_AUTH": self.password} if self.password is not None else None
            try:
                done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                      timeout=self.ready_timeout, check=False)
            except subprocess.TimeoutExpired as error:
                raise ServiceError(f"{' '.join(command)} did not finish within {self.ready_timeout:g} s") from error
            if done.returncode != 0:
                raise ServiceError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
            self._wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    __enter__ = start

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop every node and remove its files (nodes-<port>.conf included)."""
        for server in self.servers:
            server.stop()
            for path in server.directory.glob("nodes-*.conf"):
                path.unlink()

    def _wait_ok(self) -> None:
        import redis

        deadline = time.monotonic() + self.ready_timeout
        clients = [redis.Redis(port=port, password=self.password, socket_timeout=1.0) for _, port in self.nodes]
        try:
            while True:
                infos = [client.cluster("INFO") for client in clients]
                if all(i["cluster_state"] == "ok" and int(i["cluster_known_nodes"]) == len(clients) for i in infos):
                    return
                if time.monotonic() > deadline:
                    raise ServiceError(f"cluster {self.nodes} not ok within {self.ready_timeout:g} s: {infos}")
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()


def speed_up_moto() -> None:
    """Three changes to moto, in its server and in this process's mock alike: its dispatcher's listing of moto's package
    directory on every request (~150 stat calls, a tenth of the server's CPU in the test runs) is read once; a JSON
    template body is read with json, not PyYAML's pure-Python loader (80 ms a CreateStack for this template); the
    server's werkzeug logs no line per request (formatting and colouring them was 4 % of its CPU in the integration
    tier; errors are still logged)."""
    import functools
    import json
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    import moto.backends
    from moto.cloudformation.models import Stack

    if getattr(Stack, "_sume_json_first", False):
        return
    listing = moto.backends.list_of_moto_modules
    moto.backends.list_of_moto_modules = functools.cache(lambda: tuple(listing()))
    yaml_first = Stack.parse_template
    Stack.parse_template = staticmethod(
        lambda template: json.loads(template) if template.lstrip().startswith("{") else yaml_first(template))
    Stack._sume_json_first = True


class MotoServer(Service):
    """moto's server (all AWS services over HTTP); ``.endpoint_url`` is ``http://127.0.0.1:P``."""

    name = "moto_server"

    def __init__(self, port: int | None = None, ready_timeout: float = READY_TIMEOUT_S) -> None:
        port = port or free_port()
        main = "from tools.services import speed_up_moto; speed_up_moto(); from moto.server import main; main()"
        # A queue may be purged again within 60 s: the in-process stack empties its queues so on every reset.
        env = {**os.environ, "MOTO_SQS_ENFORCE_STRICT_QUEUE_PURGE_BEHAVIOUR": "false"}
        super().__init__([sys.executable, "-c", main, "-H", "127.0.0.1", "-p", str(port)], port, ready_timeout,
                         cwd=str(ROOT), env=env)
        self.endpoint_url = f"http://127.0.0.1:{port}"

    def after_start_check(self) -> bool:
        """Ready once moto itself answers (its own ``/moto-api/data.json``), not any server on the port: between
        :func:`free_port` and moto's bind another process may take it (a loaded CI run met one that answered 404)."""
        try:
            with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/data.json", timeout=2.0) as reply:
                return bool(reply.status == 200)
        except (OSError, ValueError):
            return False

    def start(self) -> Self:
        """Start; on a port another process took meanwhile, again on a new one (three tries)."""
        for attempt in range(3):
            try:
                return super().start()
            except ServiceError:
                if attempt == 2:
                    raise
                self.stop()
                old, self.port = self.port, free_port()
                self.command_parts = [str(self.port) if part == str(old) else part for part in self.command_parts]
                self.command = " ".join(shlex.quote(c) for c in self.command_parts)
                self.endpoint_url = f"http://127.0.0.1:{self.port}"
        raise AssertionError("unreachable")

    def reset(self) -> None:
        """Forget every resource moto holds (POST /moto-api/reset)."""
        urllib.request.urlopen(f"{self.endpoint_url}/moto-api/reset", data=b"", timeout=10.0).close()
