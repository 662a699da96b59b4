"""Finding finished jobs in bulk, which only ever brings a job's own read forward: sweeps of
Sume's list route (:mod:`.sweep`) and what they have proven per kind (:mod:`.coverage`); verified
webhook deliveries (:mod:`.webhook`) and when they arrive per kind (:mod:`.deliveries`).
"""

from __future__ import annotations

from .. import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "coverage": ("CANARY_EVERY", "CoverageStore", "CoverageView", "is_canary"),
    "deliveries": ("DeliveryStore", "DeliveryView", "LOST_WITHIN", "LatePlan"),
    "sweep": ("SweepFunctionSettings", "SweepSettings", "Sweeper", "Sweeps"),
    "webhook": ("WebhookReceiver", "WebhookSettings", "raw_body"),
})
