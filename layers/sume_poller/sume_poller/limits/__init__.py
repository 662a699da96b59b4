"""What Redis decides for every actor: the connection (:mod:`.redisconn`), the shared read and
create budget per Sume key (:mod:`.budget`, its Lua in ``budget.lua`` and its scripts; the pending
count it scales its day with, :mod:`.pending`), the per-job lease of a chain (:mod:`.lease`), the
gate before a Sume read that takes both (:mod:`.gate`, ``gate.lua``), and the pacer that stands in
for the budget while Redis cannot be asked (:mod:`.pacer`).
"""

from __future__ import annotations

from .. import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "budget": ("Budget", "DAY", "Grant", "MINUTE", "Mode", "NO_DAY_RESERVE", "RateInfo", "granted_per_window"),
    "gate": ("ReadGate",),
    "pacer": ("LocalPacer",),
    "pending": ("PendingMailbox",),
    "lease": ("Claim", "LeaseStore", "Step", "new_nonce", "new_token", "resting_value"),
    "redisconn": (
        "ColdStartCheck", "MISCONFIGURED", "RedisFailure", "RedisMisconfigured", "UNAVAILABLE", "connect", "describe",
        "failure",
    ),
})
