"""The schedule: how long jobs take (:mod:`.durations`, a log-normal fit per profile), the fitted
models cached per container (:mod:`.models`), and where a chain's next status read lands
(:mod:`.planner`). Pure functions but for the cache; no Redis, no Sume.
"""

from __future__ import annotations

from .. import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "durations": ("LogNormal", "MIN_OBSERVATIONS"),
    "models": ("ModelCache",),
    "planner": (
        "Bounds", "DEFAULT_W0", "defer_delay", "max_wait", "next_delay", "overdue", "profile_key", "read_priority",
    ),
})
