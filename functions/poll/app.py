"""Poll function (SQS trigger): each message is one step of a job's chain, at most one Sume read.

Thin handler: the state machine is ``sume_poller.poll.poller``, the batch adapter ``sume_poller.poll.batch``.
Returns an SQS partial batch response (``ReportBatchItemFailures``).
"""

from __future__ import annotations

from typing import Any

from sume_poller.core.observability import logger, metrics, traced
from sume_poller.poll.batch import emit_metrics
from sume_poller.wiring import poll as wiring


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(clear_state=True)
@traced
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    report = wiring.runner().run(event, context.get_remaining_time_in_millis)
    emit_metrics(report)
    return report.response()
