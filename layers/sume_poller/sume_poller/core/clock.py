"""The poller's clock: wall time, optionally compressed for local runs.

Every time the project reasons about - due times, deadlines, delays, lease and budget windows,
Sume's hints and ``Retry-After`` - is in *clock seconds*. In production the clock is the wall
clock (``scale = 1``). Local runs set ``TIME_SCALE`` below 1 to compress time: with ``0.01`` a
clock second lasts 10 ms of real time, so a 40-minute result wait or a day of read budget
costs seconds. The Sume simulator runs on the same clock (same origin, same scale), so its
hints, windows and job durations agree with the poller's.

Clock time is ``ORIGIN + (wall - ORIGIN) / scale``: both sides compute it from the wall clock
alone, with no shared state, and at ``scale = 1`` it *is* the wall clock. What must be spent in
real time - SQS ``DelaySeconds``, Redis TTLs, socket timeouts - is converted with
:meth:`Clock.to_real`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: The instant from which compressed time runs (2026-01-01T00:00:00Z).
ORIGIN = 1_767_225_600.0


class Clock:
    """Clock seconds from the wall clock; ``scale`` real seconds per clock second (0 < scale <= 1)."""

    def __init__(self, scale: float = 1.0, wall: Callable[[], float] = time.time) -> None:
        if not 0 < scale <= 1:
            raise ValueError(f"clock scale must be in (0, 1], not {scale!r}")
        self.scale = scale
        self._wall = wall

    def now(self) -> float:
        """Clock seconds since the epoch."""
        wall = self._wall()
        return wall if self.scale == 1 else ORIGIN + (wall - ORIGIN) / self.scale

    def to_real(self, seconds: float) -> float:
        """Real seconds that ``seconds`` of clock time take."""
        return seconds * self.scale

    def from_real(self, seconds: float) -> float:
        """Clock seconds that ``seconds`` of real time make."""
        return seconds / self.scale

    def __repr__(self) -> str:
        return f"Clock(scale={self.scale:g})"
