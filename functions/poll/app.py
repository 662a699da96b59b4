"""Poll function (SQS trigger): one Sume read per message, under the job's Redis lease.

Thin handler: the logic is in the shared layer (``sume_poller.poller``). Returns an SQS
partial batch response (``ReportBatchItemFailures``).
"""

from __future__ import annotations

from typing import Any

from sume_poller import runtime
from sume_poller.observability import logger, metrics
from sume_poller.poller import handle_batch


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return handle_batch(event, context.get_remaining_time_in_millis, runtime.poller())
