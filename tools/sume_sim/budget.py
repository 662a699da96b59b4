"""Request budgets of one API key, counted by the simulator itself.

Each class of calls (reads, creates) has a minute and a day window, each of a kind
(:class:`~tools.sume_sim.config.BudgetWindows`): a *fixed* window ``k`` of size ``W`` covers clock
time ``[k*W, (k+1)*W)``; a *sliding* one, at each request, the ``W`` seconds before it (``(t-W, t]``).
Every attempt counts in both windows, refused ones too, and an attempt is refused when, once
counted, it takes an enforced window past its limit. An optional second consumer of the same key
spends a share of each enforced window's limit evenly over time (events ``W / (share * limit)``
apart). Whatever the kind, each window size keeps a bounded history of its fixed windows (what was
attempted, served and refused in each) for tests and benchmarks.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass

from tools.sume_sim.config import DAY, MINUTE, Budget, BudgetWindows

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


@dataclass(frozen=True)
class Span:
    """An enforced window as one request sees it: its limit, the attempts it counts (both
    consumers'), and clock seconds until it counts fewer (a fixed window's end; a sliding one's
    oldest attempt leaving it) and until an attempt would pass (the same for a fixed window)."""

    size: int
    limit: int
    count: int
    reset: int
    retry_after: int

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.count)


class BudgetBook:
    """The windows of one class of calls of one key."""

    def __init__(self) -> None:
        self._history: dict[int, OrderedDict[int, Window]] = {size: OrderedDict() for size in WINDOW_SIZES}
        #: This client's attempts of the last window of each size, oldest first (sliding windows).
        self._recent: dict[int, deque[float]] = {size: deque() for size in WINDOW_SIZES}

    def admit(self, now: float, budget: Budget, share: float = 0.0,
              kinds: BudgetWindows = BudgetWindows()) -> Admission:  # noqa: B008 - a frozen default
        """Count one attempt at clock time ``now``; refuse it when a window is now past its limit."""
        windows = [self._window(size, limit, now, share, create=True) for size, limit in budget.limits().items()]
        for window in windows:
            window.attempts += 1
        for size, recent in self._recent.items():
            recent.append(now)
            while recent and recent[0] <= now - size:
                recent.popleft()
        spans = self._spans(windows, now, share, kinds)
        exceeded = [s for s in spans if s.count > s.limit]
        for window in windows:
            if exceeded:
                window.refused += 1
            else:
                window.served += 1
        retry_after = max((s.retry_after for s in exceeded), default=None)
        return Admission(not exceeded, retry_after, _rate_view(spans))

    def peek(self, now: float, budget: Budget, share: float = 0.0,
             kinds: BudgetWindows = BudgetWindows()) -> RateView | None:  # noqa: B008 - a frozen default
        """The headers' view without counting anything."""
        windows = [self._window(s, lim, now, share, create=False) for s, lim in budget.limits().items()]
        return _rate_view(self._spans(windows, now, share, kinds))

    def _spans(self, windows: list[Window], now: float, share: float, kinds: BudgetWindows) -> list[Span]:
        spans = []
        for w in windows:
            if w.limit is None:
                continue
            if kinds.kind(w.size) == "fixed":
                wait = seconds_until(w.end, now)
                spans.append(Span(w.size, w.limit, w.count, wait, wait))
            else:
                spans.append(self._sliding(w.size, w.limit, now, share))
        return spans

    def _sliding(self, size: int, limit: int, now: float, share: float) -> Span:
        """The window ``(now - size, now]``: this client's attempts in it and the other consumer's."""
        start = now - size
        recent = self._recent[size]
        skip = 0
        while skip < len(recent) and recent[skip] <= start:  # a peek's: attempts before the window
            skip += 1
        gap = size / (share * limit) if share > 0 else math.inf
        others = math.floor(now / gap + _EPSILON) - math.floor(start / gap + _EPSILON) if share > 0 else 0
        count = len(recent) - skip + others
        # Oldest first: the first leaves the window soonest; an attempt at t passes once at most
        # limit - 1 of them are later than t - size (once the (count - limit)-th, from 0, has left).
        merged = heapq.merge(itertools.islice(recent, skip, None), _events(gap, start, others))
        oldest = list(itertools.islice(merged, max(1, count - limit + 1)))
        leaves = seconds_until(oldest[0] + size, now) if oldest else size
        retry = seconds_until(oldest[count - limit] + size, now) if count >= limit else 1
        return Span(size, limit, count, leaves, retry)

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


def _events(gap: float, start: float, n: int) -> Iterator[float]:
    """The other consumer's first ``n`` attempts after ``start``, ``gap`` apart (evenly, ``share *
    limit`` a window)."""
    k = math.floor(start / gap + _EPSILON) + 1 if n else 0
    for i in range(n):
        yield (k + i) * gap


def _rate_view(spans: list[Span]) -> RateView | None:
    """The enforced window with the least remaining (ties: the shorter), plus the policy."""
    enforced = sorted(spans, key=lambda s: s.size)
    if not enforced:
        return None
    tightest = min(enforced, key=lambda s: (s.remaining, s.size))
    policy = ", ".join(f"{s.limit};w={s.size}" for s in enforced)
    return RateView(tightest.limit, tightest.remaining, tightest.reset, policy)
