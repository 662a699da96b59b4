"""The pending-count mailbox: fan-out posts how many jobs of a key are pending, and the oldest one's
submission, in the key's budget hash; the budget's scripts read the count (the day reserve's scale,
passed on with every grant), the sweeps read both (their cost rule, how far back to page)."""

from __future__ import annotations

from typing import Any


class PendingMailbox:
    """Fields ``pending`` and ``oldest_pending`` of one budget's hash (``key``). Each post is one
    round trip, safe to repeat (the latest count wins)."""

    def __init__(self, client: Any, key: str) -> None:
        self._r = client
        self.key = key

    def set_pending(self, count: int) -> None:
        """The key's pending jobs, as fan-out counted them this tick."""
        self._r.hset(self.key, "pending", count)

    def set_oldest_pending(self, submitted: float) -> None:
        """The oldest pending job's submission (fan-out, on each full round of the pending index):
        sweeps page back no further."""
        self._r.hset(self.key, "oldest_pending", submitted)
