"""Jobs function (direct invoke, and an AWS_IAM function URL): read a job in one call (GetJob),
and submit over HTTP (POST /jobs invokes the submit function). Thin handler: the routes are
``sume_poller.api.jobsapi``, GetJob ``sume_poller.api.reader``."""

from __future__ import annotations

from typing import Any

from sume_poller.api.jobsapi import caller, is_url_request
from sume_poller.core.observability import MetricUnit, logger, metrics, traced
from sume_poller.wiring import jobs as wiring


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(clear_state=True)
@traced
def lambda_handler(event: Any, context: Any) -> dict[str, Any]:
    api = wiring.api()
    if not is_url_request(event):
        answer = api.invoke(event)
        metrics.add_metric(name=f"Jobs_{answer.status}", unit=MetricUnit.Count, value=1)
        return answer.body
    answer = api.http(event)
    http = event["requestContext"].get("http") or {}
    # The request and its outcome, never the reply: it may hold a pre-signed URL.
    logger.info("request", extra={"method": http.get("method"), "path": event.get("rawPath"),
                                  "status": answer.status, "caller": caller(event)})
    metrics.add_metric(name=f"Jobs_{answer.status}", unit=MetricUnit.Count, value=1)
    return answer.for_url()
