"""Submit function (direct invoke): start a paid Sume job with an Idempotency-Key, or register an
already submitted job id; record it as pending and start its chain. See ``sume_poller.submit``."""

from __future__ import annotations

from typing import Any

from sume_poller.observability import MetricUnit, logger, metrics, traced
from sume_poller.submit import CreateBudgetExhausted
from sume_poller.wiring import submit as wiring


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(clear_state=True)
@traced
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    try:
        reply = wiring.submitter().handle(event, context.get_remaining_time_in_millis)
    except CreateBudgetExhausted:
        metrics.add_metric(name="CreateBudgetExhausted", unit=MetricUnit.Count, value=1)
        raise
    metrics.add_metric(name=f"Submit_{reply['status']}", unit=MetricUnit.Count, value=1)
    return reply
