"""Submit function: start a paid Sume job with an Idempotency-Key, or register an already
submitted job id; record it as pending and start its chain (direct invoke). A submission the
create budget cannot take now is queued, and the create queue's messages (its SQS event source)
are the drain steps that create them in arrival order. See ``sume_poller.creates.submit`` and
``sume_poller.creates.drain``."""

from __future__ import annotations

from typing import Any

from sume_poller.core.observability import MetricUnit, logger, metrics, traced
from sume_poller.creates.submit import CreateBudgetExhausted
from sume_poller.wiring import submit as wiring


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(clear_state=True)
@traced
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    if isinstance(event, dict) and "Records" in event:  # the create queue: drain steps
        report = wiring.drainer().run(event, context.get_remaining_time_in_millis)
        for name, value in (("SubmissionsCreatedFromQueue", report.created), ("SubmissionsExpired", report.expired),
                            ("SubmissionsRejectedFromQueue", report.rejected), ("CreateReplays", report.replayed),
                            ("SubmissionsExpiredUnknown", report.expired_unknown)):
            if value:
                metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
        return report.response()
    try:
        reply = wiring.submitter().handle(event, context.get_remaining_time_in_millis)
    except CreateBudgetExhausted:
        metrics.add_metric(name="CreateBudgetExhausted", unit=MetricUnit.Count, value=1)
        raise
    metrics.add_metric(name=f"Submit_{reply['status']}", unit=MetricUnit.Count, value=1)
    if reply["status"] == "queued" and not reply["replayed"]:
        metrics.add_metric(name="SubmissionsQueued", unit=MetricUnit.Count, value=1)
    return reply
