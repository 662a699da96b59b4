"""Each function imports what it runs (cold start): its handler module, in a fresh interpreter with
Lambda's path (the function's code dir, then the layer), loads none of the layer's modules that
belong to other functions. Bench figure 4 measures what that is worth."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import json, sys, app; print(json.dumps(sorted(m for m in sys.modules "
         "if m.startswith('sume_poller.') or m in ('redis', 'statistics', 'aws_lambda_powertools.utilities.batch'))))")
#: function -> modules its handler must not load (``sume_poller.`` left out), and why.
NOT_LOADED = {
    "poll": {"discovery.sweep", "discovery.webhook", "creates.submit", "creates.createqueue", "creates.drain",
             "poll.fanout", "api.jobsapi", "api.reader", "sume.listing", "sume.created"},
    "fanout": {"schedule.planner", "schedule.durations", "schedule.models", "discovery.sweep", "discovery.webhook",
               "creates.submit", "creates.drain", "poll.poller", "sume.client"},
    "submit": {"discovery.sweep", "discovery.webhook", "poll.poller", "poll.fanout", "creates.drain", "api.jobsapi",
               "api.reader", "sume.status", "sume.listing"},  # drain: SQS events only
    "sweep": {"schedule.planner", "discovery.webhook", "creates.submit", "poll.poller", "poll.fanout", "creates.drain",
              "api.jobsapi", "sume.status", "sume.created"},
    "webhook": {"schedule.planner", "discovery.sweep", "creates.submit", "poll.poller", "poll.fanout", "creates.drain",
                "sume.client", "api.jobsapi"},
    # Never talks to Redis or Sume: not the Redis client, nor the keys, budgets, leases or Sume client.
    "jobs": {"limits", "limits.redisconn", "limits.budget", "limits.lease", "limits.gate", "config.keys", "sume",
             "sume.client", "creates.submit", "poll.poller", "schedule.planner", "wiring.shared"},
}
#: function -> a module of its own, which it does load.
OWN = {"poll": "poll.poller", "fanout": "poll.fanout", "submit": "creates.submit", "sweep": "discovery.sweep",
       "webhook": "discovery.webhook", "jobs": "api.jobsapi"}


def _loaded(function: str) -> set[str]:
    paths = [str(ROOT / "functions" / function), str(ROOT / "layers" / "sume_poller")]
    done = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path[:0] = {paths!r}; {PROBE}"],
                          capture_output=True, text=True, timeout=60, check=True, cwd=ROOT)
    return {m.removeprefix("sume_poller.") for m in json.loads(done.stdout)}


@pytest.mark.parametrize("function", sorted(NOT_LOADED))
def test_a_handler_loads_no_module_of_another_function(function: str) -> None:
    loaded = _loaded(function)
    assert OWN[function] in loaded  # the probe sees the layer at all
    assert not loaded & NOT_LOADED[function], sorted(loaded & NOT_LOADED[function])


def test_the_jobs_function_does_not_import_redis() -> None:
    assert "redis" not in _loaded("jobs")


@pytest.mark.parametrize("function", sorted(NOT_LOADED))
def test_statistics_waits_for_the_first_learned_plan(function: str) -> None:
    """statistics and the fractions it imports (about 1 ms of a cold start) load where a plan needs the
    normal quantile, not with the handler."""
    assert "statistics" not in _loaded(function)
