"""Fan-out function (EventBridge schedule): queue a poll for every pending job without a live lease."""

from __future__ import annotations

from typing import Any

from sume_poller import runtime
from sume_poller.fanout import run_fanout
from sume_poller.observability import MetricUnit, logger, metrics


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    report = run_fanout(runtime.settings(), runtime.job_store(), runtime.poll_queue(),
                        runtime.lease_store(), context.get_remaining_time_in_millis)
    metrics.add_metric(name="FanOutSent", unit=MetricUnit.Count, value=report.sent)
    metrics.add_metric(name="FanOutLeased", unit=MetricUnit.Count, value=report.leased)
    if report.send_failed:
        metrics.add_metric(name="FanOutSendFailed", unit=MetricUnit.Count, value=report.send_failed)
    if report.redis_unavailable:
        metrics.add_metric(name="FanOutRedisUnavailable", unit=MetricUnit.Count, value=1)
    logger.info("fan-out finished", extra=report.as_dict())
    return report.as_dict()
