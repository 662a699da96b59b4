"""Powertools Logger, Metrics and (optional) Tracer, shared by every function.

Service and namespace come from ``POWERTOOLS_SERVICE_NAME`` / ``POWERTOOLS_METRICS_NAMESPACE``.
Logs are JSON; every record-level line carries ``job_id`` (also as the correlation id).

The level (``POWERTOOLS_LOG_LEVEL``, the template's ``LogLevel``) is applied to the Logger's
handler. Not to the Logger: Powertools gives Lambda's Advanced Logging Controls level
(``AWS_LAMBDA_LOG_LEVEL``, from the function's ``ApplicationLogLevel``) precedence over
``POWERTOOLS_LOG_LEVEL``, ``Logger(level=...)`` and ``setLevel``. The template keeps
``ApplicationLogLevel`` at INFO (DEBUG with ``LogLevel=DEBUG``) because above INFO Lambda drops
every stdout line without a ``level`` - the EMF metric lines among them, so ``LogLevel=ERROR``
there would empty every custom metric and alarm. Metric lines are printed, not logged: no log
level filters them.

botocore's and urllib3's loggers stay at INFO or above whatever the application's level (and
follow it above INFO): at DEBUG botocore logs the SSM reply that carries the decrypted Sume key.

Tracing is on only when the template's ``Tracing`` parameter turns it on
(``POWERTOOLS_TRACE_DISABLED=false``): building a Tracer imports the X-Ray SDK (about 0.4 s of
cold start), so with tracing off no Tracer is built at all and :func:`traced` is a no-op.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, TypeVar

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

logger = Logger()
metrics = Metrics()


def configured_level(env: Mapping[str, str] = os.environ) -> int:
    """``POWERTOOLS_LOG_LEVEL`` as a :mod:`logging` level (DEBUG, INFO, WARN/WARNING, ERROR,
    CRITICAL); INFO when unset or unknown."""
    name = env.get("POWERTOOLS_LOG_LEVEL", "").strip().upper()
    level = logging.getLevelNamesMapping().get(name)
    return level if level is not None else logging.INFO


def apply_log_level(level: int) -> None:
    """Filter the application's lines at ``level`` on the Logger's handler (which Lambda's level
    does not override), and keep botocore, boto3 and urllib3 at INFO or above."""
    logger.registered_handler.setLevel(level)
    for name in ("botocore", "boto3", "urllib3"):
        library = logging.getLogger(name)
        library.setLevel(max(logging.INFO, level, library.getEffectiveLevel()))


apply_log_level(configured_level())

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


def _namespace() -> str:
    """The template's namespace (``POWERTOOLS_METRICS_NAMESPACE``; the same name where unset)."""
    return os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or "SumePoller"


def count_now(name: str, value: float = 1) -> None:
    """A count printed at once in its own EMF line: safe from any thread (the shared ``metrics``
    is flushed by the handler and is not thread-safe)."""
    from aws_lambda_powertools.metrics import single_metric

    service = os.environ.get("POWERTOOLS_SERVICE_NAME")
    with single_metric(name=name, unit=MetricUnit.Count, value=value, namespace=_namespace(),
                       default_dimensions={"service": service} if service else None):
        pass


def count_by_key(counts: Mapping[str, Mapping[str, float]]) -> None:
    """Counts with a ``key`` dimension (the Sume key's id), one EMF line per key: the per-key view
    of reads, 429s, budget waits and pending jobs. Powertools' shared ``metrics`` would put the
    dimension on every metric of the invocation, so each key gets an ephemeral set of its own;
    the alarms read them with Metrics Insights queries grouped by key (one alarm for all keys)."""
    from aws_lambda_powertools.metrics import EphemeralMetrics

    for key, named in counts.items():
        if not any(named.values()):
            continue
        per_key = EphemeralMetrics(namespace=_namespace())
        per_key.add_dimension(name="key", value=key)
        for name, value in named.items():
            per_key.add_metric(name=name, unit=MetricUnit.Count, value=value)
        per_key.flush_metrics()


__all__ = ["MetricUnit", "apply_log_level", "configured_level", "count_by_key", "count_now", "logger", "metrics",
           "traced", "tracer", "tracing_enabled"]
