"""observability.py: LogLevel applies inside Powertools' Logger even where Lambda's Advanced
Logging Controls (AWS_LAMBDA_LOG_LEVEL, from the template's ApplicationLogLevel) would override
the Logger's own level - and the EMF metric lines, which carry no level, always print. Each case
runs in a fresh interpreter: the Logger is configured once, at import (``SUME_LAYER`` points it at
another copy of the layer's package, e.g. an older one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import logging
from sume_poller.core.observability import logger, metrics, MetricUnit
logger.debug("line-debug")
logger.info("line-info")
logger.warning("line-warning")
logger.error("line-error")
logging.getLogger("botocore").debug("line-botocore-debug")
metrics.add_metric(name="Probe", unit=MetricUnit.Count, value=1)
metrics.flush_metrics()
"""


def run(**env: str) -> tuple[set[str], list[dict[str, object]]]:
    """(the logged messages, the EMF documents) one process printed."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("POWERTOOLS_", "AWS_LAMBDA_"))}
    layer = os.environ.get("SUME_LAYER") or str(ROOT / "layers" / "sume_poller")
    environment.update({"PYTHONPATH": layer, "POWERTOOLS_SERVICE_NAME": "sume-poller",
                        "POWERTOOLS_METRICS_NAMESPACE": "SumePoller", **env})
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=environment, capture_output=True, text=True,
                          timeout=60, check=True)
    lines = [json.loads(line) for line in (done.stdout + done.stderr).splitlines() if line.startswith("{")]
    messages = {str(line["message"]) for line in lines if "message" in line}
    return messages, [line for line in lines if "_aws" in line]


@pytest.mark.parametrize(("level", "shown"), [
    ("ERROR", {"line-error"}),
    ("WARN", {"line-warning", "line-error"}),
])
def test_the_configured_level_holds_under_lambdas_info_level_and_metrics_still_print(
        level: str, shown: set[str]) -> None:
    messages, documents = run(AWS_LAMBDA_LOG_LEVEL="INFO", POWERTOOLS_LOG_LEVEL=level)
    assert messages == shown
    assert [d["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"] for d in documents] == ["Probe"]  # type: ignore[index]


def test_debug_shows_everything_but_botocore() -> None:
    messages, documents = run(AWS_LAMBDA_LOG_LEVEL="DEBUG", POWERTOOLS_LOG_LEVEL="DEBUG")
    assert messages == {"line-debug", "line-info", "line-warning", "line-error"}
    assert len(documents) == 1


def test_without_lambdas_level_the_configured_level_still_applies() -> None:
    messages, _ = run(POWERTOOLS_LOG_LEVEL="WARN")
    assert messages == {"line-warning", "line-error"}
    messages, _ = run()
    assert messages == {"line-info", "line-warning", "line-error"}
