"""Local services for tests, the demo and CI: redis-server and moto server as child processes.

Each service runs in the foreground as a child of this process on a free 127.0.0.1 port, is
polled until it answers (with a deadline, no fixed sleeps), and is stopped by its PID only:
SIGTERM, then SIGKILL if it has not exited by a deadline. Every started service is also stopped
at interpreter exit. Use them as context managers::

    with RedisServer() as redis, MotoServer() as moto:
        ...  # redis.url, moto.endpoint_url
"""

from __future__ import annotations

import atexit
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
from pathlib import Path
from types import TracebackType
from typing import IO, Self

__all__ = ["HttpService", "MotoServer", "RedisServer", "ServiceError", "free_port", "running_services"]

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


class _Service:
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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(port={self.port}, pid={self.pid})"


def _find_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    for candidate in ("/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server"):
        if os.access(candidate, os.X_OK):
            return candidate
    raise ServiceError(
        "redis-server binary not found on PATH. Install it with `apt-get install redis-server` "
        "(Debian/Ubuntu; run `apt-get update` first) or `brew install redis` (macOS)."
    )


class RedisServer(_Service):
    """``redis-server`` on 127.0.0.1 without persistence; ``.url`` is ``redis://127.0.0.1:P/0``."""

    name = "redis-server"

    def __init__(self, port: int | None = None, ready_timeout: float = READY_TIMEOUT_S) -> None:
        super().__init__(port, ready_timeout)
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _command(self) -> list[str]:
        binary = _find_redis_server()
        return [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
        ]  # fmt: skip

    def _cwd(self) -> str:
        # Its working directory is where it would write dump files: keep it out of the repo.
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="redis-")
        return self._dir.name

    def _probe(self) -> bool:
        """PING answers, and INFO says the server answering is our child (not another on the port)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                if not sock.recv(64).startswith(b"+PONG"):
                    return False
                sock.sendall(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
                reply = b""
                while b"process_id:" not in reply or not reply.split(b"process_id:", 1)[1].count(b"\r\n"):
                    chunk = sock.recv(4096)
                    if not chunk:
                        return False
                    reply += chunk
        except OSError:
            return False
        pid = reply.split(b"process_id:", 1)[1].split(b"\r\n", 1)[0].strip()
        return self._process is not None and pid == str(self._process.pid).encode()

    def stop(self) -> None:
        super().stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def _moto_server_command() -> list[str]:
    script = Path(sys.executable).parent / "moto_server"
    if script.exists():
        return [str(script)]
    found = shutil.which("moto_server")
    if found:
        return [found]
    return [sys.executable, "-m", "moto.server"]


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
