"""A TCP proxy between a Redis client and server that loses, delays or replaces replies on demand: what a real network
(and an ElastiCache failover) does to Redis commands, with a real client and a real server. A fault is armed for the
next ``times`` commands of a name (any case)::

    with RedisServer() as server, FaultProxy("127.0.0.1", server.port) as proxy:
        client = redis.Redis.from_url(proxy.url, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
        proxy.drop_reply("SET")
        client.set("k", "v")  # raises redis.ConnectionError, yet k is set on the server

It reads just enough RESP (RESP2 and RESP3) to find where each command ends in the client's byte stream (pipelines
included) and which server reply answers it: on one connection, replies come in the order of the commands
(out-of-band RESP3 pushes are not matched to commands). Standard library only: an asyncio event loop in a thread of
its own serves every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Self

_LINE_TYPES = b"+-:_,#("  # simple string, error, integer, null, double, boolean, big number
_BLOB_TYPES = b"$!="  # bulk string, bulk error, verbatim string
_AGGREGATES = {ord("*"): 1, ord("~"): 1, ord(">"): 1, ord("%"): 2, ord("|"): 2}  # items per count


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
        raise ValueError(f"not RESP: {bytes(buf[pos:after])!r}") from None  # the connection ends
    if kind in _BLOB_TYPES:
        return after if size < 0 else (after + size + 2 if len(buf) >= after + size + 2 else None)
    if kind not in _AGGREGATES:
        raise ValueError(f"not RESP: {bytes(buf[pos:after])!r}")
    end = after
    for _ in range(max(size, 0) * _AGGREGATES[kind]):
        if (item := _value_end(buf, end)) is None:
            return None
        end = item
    return _value_end(buf, end) if kind == ord("|") else end  # an attribute comes before its value


def _command_end(buf: bytearray) -> tuple[int, str] | None:
    """(end, upper-case name) of the client command at the start of ``buf``; None while incomplete. Clients send arrays
    of bulk strings; inline commands (one text line, as redis-cli) are read too."""
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


class FaultProxy:
    """Forward ``127.0.0.1:port`` to ``target_host:target_port`` and apply the armed faults."""

    def __init__(self, target_host: str, target_port: int, port: int = 0, connect_timeout: float = 5.0) -> None:
        self.target = (target_host, target_port)
        self.connect_timeout = connect_timeout
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._lock = threading.Lock()  # the faults and counters, shared with the caller's thread
        self._faults: list[_Fault] = []
        self._seen: Counter[str] = Counter()
        self._applied: Counter[tuple[str, str]] = Counter()
        self._links: dict[asyncio.Task[None], list[asyncio.StreamWriter]] = {}  # each link's two connections
        self._refusing = False
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop.run_forever, name=f"faultproxy-{self.port}", daemon=True)
            self._thread.start()
            self._server = self._call(asyncio.start_server(self._link, sock=self._listener))
        return self

    __enter__ = start

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop accepting, close every connection and the loop."""
        if self._thread is not None and self._loop.is_running():
            self._call(self._close_links(stop=True))
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5.0)
            self._loop.close()
        self._listener.close()

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10.0)

    def drop_reply(self, command: str, times: int = 1) -> None:
        """The next ``times`` ``command``s run on the server; their replies are dropped and the client's connection
        closed."""
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
        self._call(self._close_links())

    def accept(self) -> None:
        """End the outage: new connections are forwarded again."""
        self._refusing = False

    @property
    def seen(self) -> Counter[str]:
        """Commands received from clients, by upper-case name (injected ones included)."""
        with self._lock:
            return Counter(self._seen)

    @property
    def applied(self) -> Counter[tuple[str, str]]:
        """Faults applied, by (fault, command): e.g. ``applied["drop_reply", "SET"]``."""
        with self._lock:
            return Counter(self._applied)

    @property
    def connections(self) -> int:
        """Client connections open now."""
        return len(self._links)

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

    def _count(self, fault: _Fault, command: str) -> None:
        with self._lock:
            self._applied[fault.kind, command] += 1

    async def _close_links(self, stop: bool = False) -> None:
        """Close every connection (a link then ends: its reads see the end) and wait for the links."""
        if stop and self._server is not None:
            self._server.close()
        for writer in (w for writers in self._links.values() for w in writers):
            writer.close()
        await asyncio.gather(*self._links, return_exceptions=True)

    async def _link(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        """One client connection and the proxy's own connection to the server for it."""
        task = asyncio.current_task()
        assert task is not None
        writers = self._links[task] = [client_out]
        try:
            if self._refusing:
                return
            server_in, server_out = await asyncio.wait_for(asyncio.open_connection(*self.target),
                                                           self.connect_timeout)
            writers.append(server_out)
            # The commands whose replies the client waits for, in order: (name, fault, injected reply).
            pending: deque[tuple[str, _Fault | None, bytes | None]] = deque()

            def flush_injected() -> None:
                """Send the injected replies that are now first in line (counted before the client sees them)."""
                while pending and pending[0][2] is not None:
                    name, fault, injected = pending.popleft()
                    if fault is not None:
                        self._count(fault, name)
                    client_out.write(injected or b"")

            async def commands() -> None:
                buf = bytearray()
                while data := await client_in.read(65536):
                    buf += data
                    while (framed := _command_end(buf)) is not None:
                        command, name = bytes(buf[:framed[0]]), framed[1]
                        del buf[:framed[0]]
                        fault = self._take_fault(name) if name else None  # no name: ignored, no reply
                        if fault is not None and fault.kind == "inject_error":
                            pending.append((name, fault, fault.error))
                            flush_injected()
                            continue
                        if name:
                            pending.append((name, fault, None))
                        server_out.write(command)

            async def replies() -> None:
                buf = bytearray()
                while data := await server_in.read(65536):
                    buf += data
                    while (end := _value_end(buf, 0)) is not None:
                        reply = bytes(buf[:end])
                        del buf[:end]
                        name, fault, _ = pending[0] if pending else ("", None, None)
                        if fault is not None:
                            self._count(fault, name)
                            if fault.kind == "drop_reply":
                                return
                            await asyncio.sleep(fault.seconds)
                        if pending:
                            pending.popleft()
                        client_out.write(reply)
                        flush_injected()

            pumps = [asyncio.create_task(commands()), asyncio.create_task(replies())]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)  # bytes that are not RESP end it too
        except OSError:  # TimeoutError is one
            pass
        finally:
            for writer in writers:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
            del self._links[task]
