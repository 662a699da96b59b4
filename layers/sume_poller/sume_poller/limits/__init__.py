"""What Redis decides for every actor: the connection (:mod:`.redisconn`), the shared read and
create budget per Sume key (:mod:`.budget`), the per-job lease of a chain (:mod:`.lease`), and the
gate before a Sume read that takes both (:mod:`.gate`).
"""

from __future__ import annotations

from .. import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "budget": ("Budget", "DAY", "Grant", "LocalPacer", "MINUTE", "NO_DAY_RESERVE", "RateInfo", "granted_per_window"),
    "gate": ("ReadGate",),
    "lease": ("Claim", "LeaseStore", "Step", "new_nonce", "new_token", "resting_value"),
    "redisconn": (
        "ColdStartCheck", "MISCONFIGURED", "RedisFailure", "RedisMisconfigured", "UNAVAILABLE", "connect", "describe",
        "failure",
    ),
})
