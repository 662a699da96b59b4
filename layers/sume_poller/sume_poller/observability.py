"""Powertools Logger, Metrics and (optional) Tracer, shared by every function.

Service and namespace come from ``POWERTOOLS_SERVICE_NAME`` / ``POWERTOOLS_METRICS_NAMESPACE``.
Logs are JSON; every record-level line carries ``job_id`` (also as the correlation id).

botocore's and urllib3's loggers stay at INFO or above whatever the application's level: at
DEBUG botocore logs the SSM reply that carries the decrypted Sume key.

Tracing is on only when the template's ``Tracing`` parameter turns it on
(``POWERTOOLS_TRACE_DISABLED=false``): building a Tracer imports the X-Ray SDK (about 0.4 s of
cold start), so with tracing off no Tracer is built at all and :func:`traced` is a no-op.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

logger = Logger()
metrics = Metrics()

for _name in ("botocore", "boto3", "urllib3"):
    logging.getLogger(_name).setLevel(max(logging.INFO, logging.getLogger(_name).getEffectiveLevel()))

F = TypeVar("F", bound=Callable[..., Any])


def tracing_enabled() -> bool:
    return os.environ.get("POWERTOOLS_TRACE_DISABLED", "true").strip().lower() == "false"


@cache
def tracer() -> Any:
    from aws_lambda_powertools import Tracer

    return Tracer()


def traced(handler: F) -> F:
    """``Tracer.capture_lambda_handler`` when tracing is on; the handler itself otherwise."""
    if not tracing_enabled():
        return handler
    wrapped: F = tracer().capture_lambda_handler(handler)
    return wrapped


__all__ = ["MetricUnit", "logger", "metrics", "traced", "tracer", "tracing_enabled"]
