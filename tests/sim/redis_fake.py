"""Redis for the simulation: :mod:`.miniredis` on the scheduler's clock, its calls scheduler points.

Every command (or pipeline) the layer sends is a scheduler point. The scheduler may make Redis go
down for a while (every command fails with a connection error, as a refused connection does), lose
its data (a flush; a restart also loses its scripts), or lose a reply after the command ran (the
layer's client then retries once, as it is configured to).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .miniredis import Client, Server


class RedisWorld:
    """One Redis server and the faults the scheduler may inject into it."""

    def __init__(self, sched: Any, faults: Any) -> None:
        self.sched = sched
        self.faults = faults
        self.server = Server(sched.clock)
        self.down_until = -1.0
        #: (start, end) of every outage, and the clock times Redis lost its data.
        self.outages: list[tuple[float, float]] = []
        self.losses: list[float] = []
        #: Called before each command - alone or in a pipeline - with (actor, command name, its arguments).
        self.observers: list[Callable[[Any, str, list[str]], None]] = []
        self._client = Client(self.server, self._gate, self._lost)
        #: The layer's socket timeout (``REDIS_TIMEOUT``, real seconds): a command held up longer fails.
        self.timeout = 1.0

    @property
    def down(self) -> bool:
        return bool(self.sched.now < self.down_until)

    def client(self) -> Client:
        """The layer's client (one per world: each command is a call of its own)."""
        return self._client

    def _gate(self, name: str, args: list[str] | None, commands: list[tuple[str, list[str]]] | None = None) -> None:
        """One round trip (``commands``: a pipeline's, each told to the observers as a command alone is)."""
        sent = self.sched.now
        self.sched.point(f"redis {name}")
        if self.sched.now - sent > self.timeout:  # the caller was paused past its socket timeout
            self.sched.note_fault("redis command timed out (the caller was paused)")
            raise RedisTimeoutError("Timeout reading from socket (simulated: the caller was paused)")
        if self.down:
            self.sched.note_fault("redis down")
            raise RedisConnectionError("Error 111 connecting to redis. Connection refused (simulated outage).")
        for command, arguments in ([(name, args)] if args is not None else []) + list(commands or ()):
            for observer in self.observers:
                observer(self.sched.current, command, arguments)

    def _lost(self) -> bool:
        if self.sched.current is None or not self.faults.take("redis_lost_reply"):
            return False
        self.sched.note_fault("redis reply lost")
        return True

    # -- environment faults ----------------------------------------------------------------------------
    def outage(self, seconds: float) -> None:
        start = self.sched.now
        self.down_until = start + seconds
        self.outages.append((start, start + seconds))

    def lose_data(self, scripts: bool) -> None:
        """A flush (``scripts`` False) or a restart (the script cache goes too)."""
        self.server.flush(scripts=scripts)
        self.losses.append(self.sched.now)
