"""Submit function (direct invoke): start a paid Sume job with an Idempotency-Key, or register
an already submitted job id, and record it as pending. See ``sume_poller.submit`` for the event."""

from __future__ import annotations

from typing import Any

from sume_poller import runtime
from sume_poller.observability import MetricUnit, logger, metrics
from sume_poller.submit import handle_submit


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    reply = handle_submit(event, runtime.settings(), runtime.sume_client(), runtime.job_store(),
                          runtime.poll_queue(), context.get_remaining_time_in_millis)
    metrics.add_metric(name=f"Submit_{reply['status']}", unit=MetricUnit.Count, value=1)
    return reply
