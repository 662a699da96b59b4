"""Paid creates: submit (:mod:`.submit`, every create with its Idempotency-Key), the create
queue of submissions a key's create budget cannot take now (:mod:`.createqueue`) and its drain
(:mod:`.drain`).
"""

from __future__ import annotations

from .. import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "createqueue": ("DrainMessage", "drain_lease", "estimate_create_at"),
    "drain": ("Drainer",),
    "submit": ("CreateBudgetExhausted", "SubmitKey", "SubmitSettings", "Submitter"),
})
