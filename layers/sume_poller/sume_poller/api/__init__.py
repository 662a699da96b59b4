"""The read API: GetJob (:mod:`.reader`) and the jobs function's doors, a direct invoke and an
IAM-authorised function URL (:mod:`.jobsapi`).
"""

from __future__ import annotations

from .. import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "jobsapi": ("JobsApi", "SubmitDoor", "caller", "is_url_request"),
    "reader": ("JobReader", "JobsSettings", "presigner"),
})
