"""Powertools Logger and Metrics, shared by every function (service and namespace from env)."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

logger = Logger()
metrics = Metrics()

__all__ = ["MetricUnit", "logger", "metrics"]
