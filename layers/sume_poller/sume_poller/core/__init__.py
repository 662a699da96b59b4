"""Core facts every function shares: job ids, kinds and statuses (:mod:`.jobs`), the clock
(:mod:`.clock`), the poll message (:mod:`.messages`), logs and metrics (:mod:`.observability`) and
the AWS clients (:mod:`.aws`). No Redis, no Sume, no table.
"""

from __future__ import annotations

from .. import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "aws": ("AwsError", "client", "error_code"),
    "clock": ("Clock",),
    "jobs": (
        "CREATE_PATHS", "InvalidJobId", "KINDS", "LONG_KINDS", "OUTBOX_PREFIX", "PENDING", "PENDING_PREFIX", "State",
        "canonical_terminal_status", "classify_status", "error_delay", "keyed_shard", "result_wait_delay", "shard_of",
        "valid_key_id", "validate_job_id",
    ),
    "messages": ("MessageError", "OUTBOX_PHASE", "PollMessage", "RESULT_PHASE", "STATUS_PHASE", "parse_message"),
    "observability": ("MetricUnit", "count_by_key", "count_now", "logger", "metrics", "traced"),
})
