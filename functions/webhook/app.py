"""Webhook function (Lambda function URL): Sume's signed "job ready/failed" deliveries, as a hint to
read the job now. Thin handler: the logic is ``sume_poller.discovery.webhook``."""

from __future__ import annotations

import json
from typing import Any

from sume_poller.core.observability import MetricUnit, logger, metrics, traced
from sume_poller.discovery.webhook import raw_body
from sume_poller.wiring import webhook as wiring


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(clear_state=True)
@traced
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    answer = wiring.receiver().handle(event.get("headers") or {}, raw_body(event))
    metrics.add_metric(name=f"Webhook_{answer.status}", unit=MetricUnit.Count, value=1)
    return {"statusCode": answer.status, "headers": {"Content-Type": "application/json"},
            "body": json.dumps(answer.body)}
