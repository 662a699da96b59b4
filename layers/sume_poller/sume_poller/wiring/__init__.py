"""Per-container wiring, one module per function: each builds that function's parts once, on
first use, from its settings (read and validated there, at cold start), and imports only what the
function runs - the poll function never loads sweep, webhook or submit code, fan-out never loads
the schedule model, the jobs function never loads Redis. What the functions that talk to Redis and
Sume share is :mod:`.shared`.

:func:`once` builds a part once per container; :func:`reset` forgets every part of every loaded
function module (local runs and tests change the environment between cases).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def once(builder: F) -> F:
    """Build once per container (``functools.cache``), forgotten by :func:`reset`."""
    cached: Any = cache(builder)
    _built.append(cached)
    return cached  # type: ignore[no-any-return]


_built: list[Any] = []


def reset() -> None:
    """Forget every part, setting and cached secret of every loaded function module (the boto3
    clients follow the environment themselves, see :func:`sume_poller.core.aws.client`)."""
    for cached in _built:
        cached.cache_clear()
