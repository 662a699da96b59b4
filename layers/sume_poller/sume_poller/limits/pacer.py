"""The outage pacer: how one container paces its Sume reads alone while Redis (the shared budget,
:mod:`sume_poller.limits.budget`) cannot be asked - by the budget's two rules, at its share of them."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from .budget import granted_per_window


class LocalPacer:
    """Pacing for one container while Redis is unreachable (no shared limiter), by this rule:

    * the per-minute limit is a hard ceiling that ``share`` containers keep without talking to
      each other: each grants itself at most ``1/share`` of what the shared limiter grants a minute
      (:func:`granted_per_window`), evenly spaced;
    * the day budget is a total, not a pace: at that minute pace a container may spend up to its
      share (``1/share``) of what the day has left - as the shared limiter last told it
      (:meth:`learn`, on every grant while Redis answered), or, for a container that never heard,
      what an evenly spent day has left (the day budget times the part of the UTC day still
      ahead). Past that share it falls back to its share of the day's average rate;
    * a 429's ``Retry-After`` pauses it (:meth:`pause`).

    Slots are reserved: :meth:`take` says how far away this container's next one is, and a
    message that waits for it carries it (``PollMessage.paced_at``) instead of taking another.
    """

    def __init__(self, per_minute: int, per_day: int, share: int, now: Callable[[], float] = time.time) -> None:
        self.share = max(1, share)
        self._now = now
        minute = granted_per_window(per_minute) / 60 / self.share if per_minute > 0 else math.inf
        average = granted_per_window(per_day) / 86_400 / self.share if per_day > 0 else math.inf
        self.interval = 0.0 if math.isinf(minute) else 1 / minute
        self.slow_interval = max(self.interval, 0.0 if math.isinf(average) else 1 / average)
        self.per_day = per_day
        self._allowance: float | None = None  # of the day's reads, what this container may still spend
        self._next = 0.0
        self._lock = threading.Lock()

    def learn(self, day_left: int | None) -> None:
        """What the shared limiter says the day still grants (None: no day limit or not told)."""
        if day_left is not None and self.per_day > 0:
            with self._lock:
                self._allowance = day_left / self.share

    def pause(self, until: float) -> None:
        """Sume answered 429: no slot before ``until`` (clock seconds)."""
        with self._lock:
            self._next = max(self._next, until)

    def take(self) -> float:
        """Reserve this container's next slot; seconds until it (0: read now)."""
        with self._lock:
            now = self._now()
            if self._allowance is None:
                self._allowance = (self.per_day * (1 - (now % 86_400) / 86_400) / self.share
                                   if self.per_day > 0 else math.inf)
            at = max(now, self._next)
            spent = self._allowance < 1
            self._allowance -= 1
            self._next = at + (self.slow_interval if spent else self.interval)
            return at - now
