"""What is kept in AWS: job records and large results (:mod:`.records`: DynamoDB and S3), the
create queue's items and submission records in the same table (:mod:`.submissions`), the poll
queue (:mod:`.queue`: SQS) and the terminal event (:mod:`.events`: EventBridge).
"""

from __future__ import annotations

from .. import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "events": ("EVENT_DETAIL_TYPE", "EVENT_SOURCE", "EventBus"),
    "queue": ("Outgoing", "PollQueue", "SQS_BATCH"),
    "records": ("Ending", "INLINE_RESULT_BYTES", "JobStore", "ResultBucket", "TerminalWrite", "from_item", "to_attrs"),
    "submissions": ("CREATED", "QUEUED", "REJECTED", "queue_item", "queued_record", "settled_record", "submission_id"),
})
