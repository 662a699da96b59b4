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

The tier runs on two pytest-xdist workers (``-n 2``: the Makefile, scripts/run-tiers.sh), one per
stack: the shared stack's tests in one, and in the other the files that deploy a stack of their own
(test_redis_outage.py) or only build (test_layer_bytecode.py) - their deploy and their waits on the
compressed clock overlap the shared stack's instead of following them. Each worker is a session of
its own and deploys the stacks its tests use, so the split is by file (:data:`OWN_STACK`), made by
this file's scheduler: xdist's ``--dist loadgroup`` does not group under pytest 9 (it renames a test's
``_nodeid``, which pytest 9 no longer reads), and ``loadfile`` would deploy the shared stack in both.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tools.stack.deployed import DeployedStack

SCALE = 0.05
PARAMETERS = {"JobMaxAgeSeconds": 600, "ReadsPerMinute": 30, "ReadsPerDay": 0, "CreatesPerMinute": 0,
              "CreatesPerDay": 0}
KEYS = {"acme": {"read_budget": {"per_minute": 20}}}
#: The files that never use ``deployed_stack``: they run in the other worker.
OWN_STACK = frozenset({"test_redis_outage.py", "test_layer_bytecode.py"})


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole groups of files to a worker each (xdist's scope scheduling): the shared stack's, and :data:`OWN_STACK`."""
    from xdist.scheduler import LoadScopeScheduling

    class ByStack(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "own" if nodeid.split("::", 1)[0].rsplit("/", 1)[-1] in OWN_STACK else "shared"

    return ByStack(config, log)


@pytest.fixture(scope="session")
def deployed_stack() -> Iterator[DeployedStack]:
    with DeployedStack(time_scale=SCALE, parameters=PARAMETERS, stack_name="sume-poller-e2e", keys=KEYS) as stack:
        yield stack


@pytest.fixture
def stack(deployed_stack: DeployedStack) -> DeployedStack:
    deployed_stack.reset()
    return deployed_stack
