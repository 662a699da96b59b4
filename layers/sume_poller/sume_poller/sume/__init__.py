"""The Sume client (:mod:`.client`): every call to Sume's API, each answer classified (a status,
a result, a refusal, a retryable fault) with its rate-limit headers.
"""

from __future__ import annotations

from .. import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "client": (
        "BodyTooLarge", "Created", "Listing", "Oversized", "Pending", "Refused", "Result", "ResultStream", "Retryable",
        "StreamTimeout", "SumeClient",
    ),
})
