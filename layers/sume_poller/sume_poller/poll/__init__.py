"""The poll path: fan-out starts a chain per pending job (:mod:`.fanout`); the poll function's
batch (:mod:`.batch`) runs one step of each chain (:mod:`.poller`, its pure plan :mod:`.step`),
held by a lease or fence (:mod:`.holds`), read on the cadence (:mod:`.cadence`), a 403 judged by
the key check (:mod:`.keycheck`), and finished once with its outbox (:mod:`.outbox`, the result
kept by :mod:`.results`).
"""

from __future__ import annotations

from .. import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "batch": ("BatchRunner", "emit_metrics"),
    "cadence": ("Cadence",),
    "fanout": ("FanOut", "FanOutSettings", "Lane"),
    "outbox": ("Finisher",),
    "poller": ("PollSettings", "Poller"),
    "results": ("keep_result",),
    "step": ("Deadline", "Outcome", "Run", "plan"),
})
