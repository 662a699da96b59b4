"""Fan-out function (schedule): start a chain for every pending job without one, within the budget.

Thin handler: the logic is ``sume_poller.poll.fanout``.
"""

from __future__ import annotations

from typing import Any

from sume_poller.core.observability import MetricUnit, count_by_key, logger, metrics, traced
from sume_poller.wiring import fanout as wiring


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(clear_state=True)
@traced
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    report = wiring.fanout(context.get_remaining_time_in_millis).run()
    metrics.add_metric(name="FanOutStarted", unit=MetricUnit.Count, value=report.started)
    metrics.add_metric(name="FanOutOutboxSent", unit=MetricUnit.Count, value=report.outbox_sent)
    metrics.add_metric(name="FanOutSendFailed", unit=MetricUnit.Count, value=report.send_failed)
    metrics.add_metric(name="RedisUnavailable", unit=MetricUnit.Count, value=int(report.redis_unavailable))
    metrics.add_metric(name="RedisMisconfigured", unit=MetricUnit.Count, value=int(report.redis_misconfigured))
    metrics.add_metric(name="FanOutOutboxBackingOff", unit=MetricUnit.Count, value=report.outbox_backing_off)
    metrics.add_metric(name="FanOutOutboxClaimed", unit=MetricUnit.Count, value=report.outbox_claimed)
    if report.pending_counted is not None:
        metrics.add_metric(name="PendingJobs", unit=MetricUnit.Count, value=report.pending_counted)
    count_by_key({key: {"PendingJobs": pending, "FanOutStarted": report.started_by_key.get(key, 0)}
                  for key, pending in report.pending_by_key.items()})
    logger.info("fan-out finished", extra=report.as_dict())
    return report.as_dict()
