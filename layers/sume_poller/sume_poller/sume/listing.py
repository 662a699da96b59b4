"""The list route's outcome: one page of ``GET /jobs`` (see :mod:`.client`)."""

from __future__ import annotations

from typing import Any

from ..core.values import value
from ..limits.budget import RateInfo
from .client import _NO_RATE, Refused, Retryable


@value
class Listing:
    """One page of Sume's list route: its jobs and the cursor to the next page."""

    items: tuple[dict[str, Any], ...]
    #: The reply's cursor field, when it has one (None: last page, or no cursor field at all).
    next_cursor: str | None
    has_cursor: bool
    rate: RateInfo = _NO_RATE


ListOutcome = Listing | Retryable | Refused
