"""The end-to-end tier: template.yaml built and deployed into ministack ONCE per test session
(tools.stack.deployed.DeployedStack), with a real redis-server and the Sume simulator.

``deployed_stack`` is that one stack; ``stack`` is the same stack reset to a clean state first
(empty table, queues, Redis and simulator), for tests that run jobs.

The clock runs 20x fast (TimeScale 0.05): a job older than JobMaxAgeSeconds=600 clock seconds
times out after 30 real seconds. The read budget is small - 30 reads per clock minute, 10 per
real second - so a burst of jobs makes it bind. The daily caps are off: on a compressed clock a
day's budget is paced over 72 real minutes, longer than this tier runs, so it would only slow the
tests down without testing anything the minute window does not (tests/integration/test_budget.py holds both).

Two Sume keys are deployed: the default one and ``acme`` (its own workspace at the simulator, 20
reads a clock minute, an entry in the key configuration secret that ``SumeKeysSecretName`` names).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tools.stack.deployed import DeployedStack

SCALE = 0.05
PARAMETERS = {"JobMaxAgeSeconds": 600, "ReadsPerMinute": 30, "ReadsPerDay": 0, "CreatesPerMinute": 0,
              "CreatesPerDay": 0}
KEYS = {"acme": {"read_budget": {"per_minute": 20}}}


@pytest.fixture(scope="session")
def deployed_stack() -> Iterator[DeployedStack]:
    with DeployedStack(time_scale=SCALE, parameters=PARAMETERS, stack_name="sume-poller-e2e", keys=KEYS) as stack:
        yield stack


@pytest.fixture
def stack(deployed_stack: DeployedStack) -> DeployedStack:
    deployed_stack.reset()
    return deployed_stack
