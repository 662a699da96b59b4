"""The Sume client (:mod:`.client`): every call to Sume's API, each answer classified (a status,
a result, a refusal, a retryable fault) with its rate-limit headers; each route's own outcomes in
:mod:`.status`, :mod:`.listing` and :mod:`.created`.
"""

from __future__ import annotations

from .. import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "client": ("Refused", "Retryable", "SumeClient"),
    "created": ("Created",),
    "listing": ("Listing",),
    "status": ("BodyTooLarge", "Oversized", "Pending", "Result", "ResultStream", "StreamTimeout", "Terminal"),
})
