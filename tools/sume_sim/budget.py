"""Fixed-window request budgets of one API key, counted by the simulator itself.

Each class of calls (reads, creates) has a minute and a day window; window ``k`` of size ``W``
covers clock time ``[k*W, (k+1)*W)``. Every attempt counts in both windows, refused ones too, and
an attempt is refused when, once counted, it takes an enforced window past its limit. An optional
second consumer of the same key spends a share of each enforced window's limit evenly over the
window. Each window size keeps a bounded history for tests and benchmarks.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from tools.sume_sim.config import DAY, MINUTE, Budget

WINDOW_SIZES = (MINUTE, DAY)
HISTORY = 2_000  # windows kept per size
_EPSILON = 1e-9


def seconds_until(end: float, now: float) -> int:
    """Whole clock seconds from ``now`` until ``end``, rounded up, at least 1."""
    return max(1, math.ceil(end - now - _EPSILON))


@dataclass
class Window:
    """One window: the client's attempts (served or refused) and the other consumer's."""

    index: int
    size: int
    limit: int | None
    attempts: int = 0
    served: int = 0
    refused: int = 0
    other: int = 0
    other_served: int = 0

    @property
    def start(self) -> float:
        return float(self.index * self.size)

    @property
    def end(self) -> float:
        return float((self.index + 1) * self.size)

    @property
    def count(self) -> int:
        """Every attempt in the window, both consumers', refused ones included."""
        return self.attempts + self.other

    @property
    def remaining(self) -> int:
        return 0 if self.limit is None else max(0, self.limit - self.count)

    def catch_up_other(self, t: float, share: float) -> None:
        """Let the other consumer spend its even share up to clock time ``t`` (within the window)."""
        if self.limit is None or share <= 0:
            return
        elapsed = min(max(t, self.start), self.end) - self.start
        target = math.floor(share * self.limit * elapsed / self.size + _EPSILON)
        if target > self.other:
            added = target - self.other
            self.other_served += min(added, max(0, self.limit - self.count))
            self.other = target

    def to_dict(self) -> dict[str, int | float | None]:
        return {
            "window": self.index,
            "start": self.start,
            "limit": self.limit,
            "attempts": self.attempts,
            "served": self.served,
            "refused": self.refused,
            "other": self.other,
            "other_served": self.other_served,
        }


@dataclass(frozen=True)
class RateView:
    """What the ``RateLimit-*`` headers report."""

    limit: int
    remaining: int
    reset: int
    policy: str

    def headers(self) -> list[tuple[str, str]]:
        return [
            ("RateLimit-Limit", str(self.limit)),
            ("RateLimit-Remaining", str(self.remaining)),
            ("RateLimit-Reset", str(self.reset)),
            ("RateLimit-Policy", self.policy),
        ]


@dataclass(frozen=True)
class Admission:
    allowed: bool
    retry_after: int | None  # clock seconds, set when refused
    rate: RateView | None  # None when no window of the class is enforced


class BudgetBook:
    """The windows of one class of calls of one key."""

    def __init__(self) -> None:
        self._history: dict[int, OrderedDict[int, Window]] = {size: OrderedDict() for size in WINDOW_SIZES}

    def admit(self, now: float, budget: Budget, share: float = 0.0) -> Admission:
        """Count one attempt at clock time ``now``; refuse it when a window is now past its limit."""
        windows = [self._window(size, limit, now, share, create=True) for size, limit in budget.limits().items()]
        for window in windows:
            window.attempts += 1
        exceeded = [w for w in windows if w.limit is not None and w.count > w.limit]
        for window in windows:
            if exceeded:
                window.refused += 1
            else:
                window.served += 1
        retry_after = max((seconds_until(w.end, now) for w in exceeded), default=None)
        return Admission(not exceeded, retry_after, _rate_view(windows, now))

    def peek(self, now: float, budget: Budget, share: float = 0.0) -> RateView | None:
        """The headers' view without counting anything."""
        return _rate_view([self._window(s, lim, now, share, create=False) for s, lim in budget.limits().items()], now)

    def history(self, now: float, share: float = 0.0) -> dict[str, list[dict[str, int | float | None]]]:
        """Window size -> the kept windows, oldest first (the current one caught up to ``now``)."""
        for windows in self._history.values():
            if windows:
                windows[next(reversed(windows))].catch_up_other(now, share)
        return {str(size): [w.to_dict() for w in windows.values()] for size, windows in self._history.items()}

    def _window(self, size: int, limit: int | None, now: float, share: float, *, create: bool) -> Window:
        index = math.floor(now / size)
        windows = self._history[size]
        window = windows.get(index)
        if window is None:
            window = Window(index, size, limit)
            if not create:
                window.catch_up_other(now, share)
                return window
            if windows:  # the latest window is over: its other consumer spent all of its share
                last = windows[next(reversed(windows))]
                last.catch_up_other(last.end, share)
            windows[index] = window
            while len(windows) > HISTORY:
                windows.popitem(last=False)
        window.limit = limit
        window.catch_up_other(now, share)
        return window


def _rate_view(windows: list[Window], now: float) -> RateView | None:
    """The enforced window with the least remaining (ties: the shorter), plus the policy."""
    enforced = sorted((w for w in windows if w.limit is not None), key=lambda w: w.size)
    if not enforced:
        return None
    tightest = min(enforced, key=lambda w: (w.remaining, w.size))
    assert tightest.limit is not None
    policy = ", ".join(f"{w.limit};w={w.size}" for w in enforced)
    return RateView(tightest.limit, tightest.remaining, seconds_until(tightest.end, now), policy)
