"""Completion-time models per profile, fitted from the job store's observations, cached.

A profile is a job's kind, or its kind refined by create parameters that predict duration
(:func:`sume_poller.schedule.planner.profile_key`). Every terminal job's completion interval is recorded
under its profile and, when that is finer, under its kind too (see the poller's outbox). A
profile with too few observations falls back to its kind's model, and a kind with too few to
the static schedule (``None``). A container refits a profile at most once per ``refresh``
clock seconds; recent observations weigh more (half-life ``half_life``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..core.observability import logger
from ..core.values import value
from .durations import LogNormal, bracketed, completed, intervals_from, model_from, summary

REFRESH = 300.0
HALF_LIFE = 7 * 86_400.0


@value
class Fitted:
    """A kind's learned duration model, the observations behind it and when it was fitted."""

    model: LogNormal | None
    observations: int
    at: float
    #: Completions seen running first (see :func:`sume_poller.schedule.durations.bracketed`).
    bracketed: int = 0


class ModelCache:
    def __init__(self, store: Any, now: Callable[[], float], refresh: float = REFRESH,
                 half_life: float = HALF_LIFE) -> None:
        self.store = store
        self.now = now
        self.refresh = refresh
        self.half_life = half_life
        self._fitted: dict[str, Fitted] = {}
        self._lock = threading.Lock()

    def __call__(self, profile: str, kind: str) -> LogNormal | None:
        """The model for a job: its profile's, else its kind's, else None (static schedule)."""
        model = self.fitted(profile).model
        if model is None and profile != kind:
            model = self.fitted(kind).model
        return model

    def fitted(self, key: str) -> Fitted:
        now = self.now()
        with self._lock:
            cached = self._fitted.get(key)
            if cached is not None and now - cached.at < self.refresh:
                return cached
        try:
            intervals = intervals_from(self.store.observations(key), now, self.half_life)
            fitted = Fitted(model_from(intervals), completed(intervals), now, bracketed(intervals))
        except Exception as exc:  # keep polling on the last model (or the static schedule)
            logger.warning("completion-time model not refreshed", extra={"profile": key, "error": type(exc).__name__})
            fitted = cached or Fitted(None, 0, now)
            fitted = Fitted(fitted.model, fitted.observations, now, fitted.bracketed)
        with self._lock:
            self._fitted[key] = fitted
        return fitted

    def describe(self, key: str) -> dict[str, Any]:
        """What a human wants to see of one profile's model."""
        fitted = self.fitted(key)
        if fitted.model is None:
            return {"profile": key, "model": "static schedule", "observations": fitted.observations,
                    "bracketed": fitted.bracketed}
        return {"profile": key, **summary(fitted.model, fitted.observations)}
