"""Sweep function (schedule): find finished jobs in bulk on Sume's list route, while it saves reads.

Thin handler: the logic is ``sume_poller.discovery.sweep``; what sweeps proved is ``sume_poller.discovery.coverage``.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import single_metric

from sume_poller.core.observability import MetricUnit, count_by_key, logger, metrics, traced
from sume_poller.wiring import sweep as wiring


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(clear_state=True)
@traced
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    report = wiring.sweeper(context.get_remaining_time_in_millis).run()
    # Every tick emits every sweep metric (zeros when it skipped), so an alarm on them sees data
    # points, not gaps, and a skipped sweep reads as "nothing wrong" rather than "no data".
    # Each sweep's cost (list reads) beside what it saved: a hand-over saves at least the status read
    # that would have found the job finished.
    for name, value in (("SweepReads", report.reads), ("SweepHandedOver", report.handed_over),
                        ("SweepReadsSaved", report.handed_over),
                        ("SweepIncomplete", int(report.ran and not report.complete)),
                        ("SweepRouteBroken", int((report.incomplete_reason or "").startswith("route"))),
                        ("SweepMiss", sum(missed for _, missed in report.coverage.values()))):
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
    if (report.why_not or "").startswith("RedisMisconfigured"):
        metrics.add_metric(name="RedisMisconfigured", unit=MetricUnit.Count, value=1)
    count_by_key({key: {"SweepReads": each["reads"], "SweepHandedOver": each["handed_over"]}
                  for key, each in report.by_key.items()})
    for kind, (covered, _) in report.coverage.items():
        with single_metric(name="SweepCovered", unit=MetricUnit.Count, value=covered) as metric:
            metric.add_dimension(name="kind", value=kind)
    logger.info("sweep finished" if report.ran else "sweep skipped", extra=report.as_dict())
    return report.as_dict()
