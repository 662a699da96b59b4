"""A TCP proxy between a Redis client and server that loses, delays or replaces replies on demand:
what a real network (and an ElastiCache failover) does to Redis commands, with a real client and
a real server::

    with RedisServer() as server, FaultProxy("127.0.0.1", server.port) as proxy:
        client = redis.Redis.from_url(proxy.url, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
        proxy.drop_reply("SET")
        client.set("k", "v")  # raises redis.ConnectionError, yet k is set on the server

A fault is armed for the next ``times`` commands of a name (any case): :meth:`~FaultProxy.drop_reply`
(the command runs; its reply is dropped and the client's connection closed),
:meth:`~FaultProxy.delay_reply` (the reply is held some seconds: past the client's socket timeout
that is a timeout, the command having run), :meth:`~FaultProxy.inject_error` (the command never
reaches the server; the client gets an error reply instead, e.g. ``READONLY ...`` after a
failover). :meth:`~FaultProxy.refuse` / :meth:`~FaultProxy.accept`: an outage (connections closed,
new ones closed at once), and back.

The proxy reads just enough RESP to find where each command ends in the client's byte stream
(pipelines included) and which server reply answers it: on one connection, replies come in the
order of the commands. RESP2 and RESP3 values are framed; out-of-band RESP3 pushes (client
tracking, pub/sub) are not matched to commands. Standard library only: one thread accepts, each
connection has two threads pumping bytes.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

from tools.services import Lifecycle

__all__ = ["FaultProxy"]

_LINE_TYPES = b"+-:_,#("  # simple string, error, integer, null, double, boolean, big number
_BLOB_TYPES = b"$!="  # bulk string, bulk error, verbatim string
_AGGREGATES = {ord("*"): 1, ord("~"): 1, ord(">"): 1, ord("%"): 2, ord("|"): 2}  # items per count


class _NotResp(Exception):
    """Bytes that are not RESP: the connection cannot be followed any more."""


def _value_end(buf: bytearray, pos: int) -> int | None:
    """Index just past the RESP value starting at ``pos``, None while it is incomplete."""
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        return None
    kind, after = buf[pos], eol + 2
    if kind in _LINE_TYPES:
        return after
    try:
        size = int(buf[pos + 1 : eol])
    except ValueError:
        raise _NotResp(bytes(buf[pos:after])) from None
    if kind in _BLOB_TYPES:
        return after if size < 0 else (after + size + 2 if len(buf) >= after + size + 2 else None)
    if kind not in _AGGREGATES:
        raise _NotResp(bytes(buf[pos:after]))
    end = after
    for _ in range(max(size, 0) * _AGGREGATES[kind]):
        if (item := _value_end(buf, end)) is None:
            return None
        end = item
    return _value_end(buf, end) if kind == ord("|") else end  # an attribute comes before its value


def _command_end(buf: bytearray) -> tuple[int, str] | None:
    """(end, upper-case name) of the client command at the start of ``buf``; None while incomplete.
    Clients send arrays of bulk strings; inline commands (one text line, as redis-cli) are read too."""
    if buf[:1] != b"*":
        if (eol := buf.find(b"\n")) < 0:
            return None
        words = bytes(buf[:eol]).split()
        return eol + 1, words[0].decode(errors="replace").upper() if words else ""
    if (end := _value_end(buf, 0)) is None:
        return None
    first = buf.find(b"\r\n") + 2  # the array's first item: $<len>\r\n<name>\r\n
    if buf[first : first + 1] != b"$":
        return end, ""
    size_end = buf.find(b"\r\n", first)
    name = bytes(buf[size_end + 2 : size_end + 2 + int(buf[first + 1 : size_end])])
    return end, name.decode(errors="replace").upper()


@dataclass
class _Fault:
    kind: str  # "drop_reply", "delay_reply" or "inject_error"
    command: str
    times: int
    seconds: float = 0.0
    error: bytes = b""


@dataclass
class _Pending:
    """A command whose reply the client waits for (replies go back in command order)."""

    command: str
    fault: _Fault | None = None
    injected: bytes | None = None  # the reply the proxy answers itself, without the server


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv()
    sock.close()


class _Link:
    """One client connection and the proxy's own connection to the server for it."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self.pending: deque[_Pending] = deque()
        self.lock = threading.Lock()  # guards ``pending`` and writes to the client
        self.closed = threading.Event()
        self.threads = [threading.Thread(target=self._pump, args=(client, self._on_command), daemon=True),
                        threading.Thread(target=self._pump, args=(server, self._on_reply), daemon=True)]

    def close(self) -> None:
        with self.lock:
            if self.closed.is_set():
                return
            self.closed.set()
        _close(self.client)
        _close(self.server)
        with self.proxy._lock:
            self.proxy._links.discard(self)

    def _pump(self, source: socket.socket, handle: Callable[[bytearray], bool]) -> None:
        """Read ``source`` until it closes, handing the buffer to ``handle`` after each read;
        ``handle`` consumes the complete messages and says False to end the connection."""
        buf = bytearray()
        try:
            while not self.closed.is_set() and (data := source.recv(65536)):
                buf += data
                if not handle(buf):
                    break
        except (OSError, _NotResp):
            pass
        finally:
            self.close()

    def _on_command(self, buf: bytearray) -> bool:
        while (framed := _command_end(buf)) is not None:
            end, name = framed
            command = bytes(buf[:end])
            del buf[:end]
            if not name:  # an empty line or array: the server ignores it, no reply comes
                self.server.sendall(command)
                continue
            fault = self.proxy._take_fault(name)
            with self.lock:
                injected = fault.error if fault is not None and fault.kind == "inject_error" else None
                self.pending.append(_Pending(name, fault, injected))
                if injected is not None:
                    self._flush_injected()
                    continue
            self.server.sendall(command)
        return True

    def _flush_injected(self) -> None:
        """Send the injected replies that are now first in line (lock held)."""
        while self.pending and self.pending[0].injected is not None:
            entry = self.pending.popleft()
            self.proxy._applied(entry)  # counted before the client can see it
            self.client.sendall(entry.injected or b"")

    def _on_reply(self, buf: bytearray) -> bool:
        while (end := _value_end(buf, 0)) is not None:
            reply = bytes(buf[:end])
            del buf[:end]
            with self.lock:  # the first pending entry is never an injected one: those are flushed
                entry = self.pending[0] if self.pending else None
            fault = entry.fault if entry is not None else None
            if entry is not None and fault is not None and fault.kind != "inject_error":
                self.proxy._applied(entry)
                if fault.kind == "drop_reply" or self.closed.wait(fault.seconds):
                    return False
            with self.lock:
                if entry is not None:
                    self.pending.popleft()
                self.client.sendall(reply)
                self._flush_injected()
        return True


class FaultProxy(Lifecycle):
    """Forward ``127.0.0.1:port`` to ``target_host:target_port`` and apply the armed faults."""

    def __init__(self, target_host: str, target_port: int, port: int = 0, connect_timeout: float = 5.0) -> None:
        self.target = (target_host, target_port)
        self.connect_timeout = connect_timeout
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._links: set[_Link] = set()
        self._seen: Counter[str] = Counter()
        self._applied_counts: Counter[tuple[str, str]] = Counter()
        self._refusing = self._stopping = False
        self._accepter: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Self:
        if self._accepter is None:
            self._accepter = threading.Thread(target=self._accept_loop, name=f"faultproxy-{self.port}", daemon=True)
            self._accepter.start()
        return self

    def stop(self) -> None:
        """Stop accepting, close every connection and wait for the threads."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        if self._accepter is not None:
            with contextlib.suppress(OSError):  # wakes accept() (closing the socket does not, everywhere)
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
            self._accepter.join(timeout=5.0)
        self._listener.close()
        for thread in (t for link in self._close_links() for t in link.threads if t is not threading.current_thread()):
            thread.join(timeout=5.0)

    # -- faults -----------------------------------------------------------------------------
    def drop_reply(self, command: str, times: int = 1) -> None:
        """The next ``times`` ``command``s run on the server; their replies are dropped and the
        client's connection closed."""
        self._arm(_Fault("drop_reply", command.upper(), times))

    def delay_reply(self, command: str, seconds: float, times: int = 1) -> None:
        """The replies to the next ``times`` ``command``s are held ``seconds``, then delivered."""
        self._arm(_Fault("delay_reply", command.upper(), times, seconds=seconds))

    def inject_error(self, command: str, message: str, times: int = 1) -> None:
        """The next ``times`` ``command``s are not forwarded; the client gets ``-message``."""
        error = b"-" + message.replace("\r", " ").replace("\n", " ").encode() + b"\r\n"
        self._arm(_Fault("inject_error", command.upper(), times, error=error))

    def clear(self) -> None:
        """Disarm every fault not yet applied."""
        with self._lock:
            self._faults.clear()

    def refuse(self) -> None:
        """An outage: close every connection now and every new one as soon as it is accepted."""
        self._refusing = True
        self._close_links()

    def accept(self) -> None:
        """End the outage: new connections are forwarded again."""
        self._refusing = False

    # -- counters ---------------------------------------------------------------------------
    @property
    def seen(self) -> Counter[str]:
        """Commands received from clients, by upper-case name (injected ones included)."""
        with self._lock:
            return Counter(self._seen)

    @property
    def applied(self) -> Counter[tuple[str, str]]:
        """Faults applied, by (fault, command): e.g. ``applied["drop_reply", "SET"]``."""
        with self._lock:
            return Counter(self._applied_counts)

    @property
    def connections(self) -> int:
        """Client connections open now."""
        with self._lock:
            return len(self._links)

    # -- internals --------------------------------------------------------------------------
    def _arm(self, fault: _Fault) -> None:
        if fault.times < 1:
            raise ValueError(f"times must be at least 1, got {fault.times}")
        with self._lock:
            self._faults.append(fault)

    def _take_fault(self, command: str) -> _Fault | None:
        """Count a command and take one use of the first fault armed for it."""
        with self._lock:
            self._seen[command] += 1
            fault = next((f for f in self._faults if f.command == command), None)
            if fault is not None:
                fault.times -= 1
                if fault.times == 0:
                    self._faults.remove(fault)
            return fault

    def _applied(self, entry: _Pending) -> None:
        assert entry.fault is not None
        with self._lock:
            self._applied_counts[entry.fault.kind, entry.command] += 1

    def _close_links(self) -> list[_Link]:
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()
        return links

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._stopping:
                client.close()
                return
            if self._refusing:
                _close(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=self.connect_timeout)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, client, server)
            with self._lock:
                self._links.add(link)
            for thread in link.threads:
                thread.start()
