"""The local system the in-process figures (1, 2, 3, 5) run against, started once per bench run.

One :class:`tools.stack.inprocess.InProcessStack` at clock scale 1: a redis-server, moto server
with the template's table, queues and bucket, the Sume simulator over HTTP, and the functions'
environment in this process (so ``PollSettings.from_env`` and ``sume_poller.runtime`` build
exactly what the deployed functions build). Its read budget is far above anything these figures
read (100,000 a minute, no daily cap): they are about the lease, Redis and SQS; the budget has
figure 8. Figures build the layer's real parts on it and replace only what they measure.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from functools import cached_property
from typing import Any

from bench import SCRATCH

PARAMETERS = {"ReadsPerMinute": 100_000, "ReadsPerDay": 0, "CreatesPerMinute": 0, "CreatesPerDay": 0}
ENV = {"SUME_CONNECT_TIMEOUT": "1", "SUME_READ_TIMEOUT": "2"}


class Services:
    def __init__(self, exit_stack: ExitStack) -> None:
        self._exit = exit_stack

    @cached_property
    def stack(self) -> Any:
        from tools.stack.inprocess import InProcessStack

        SCRATCH.mkdir(exist_ok=True)
        return self._exit.enter_context(InProcessStack(time_scale=1.0, parameters=PARAMETERS, env=ENV,
                                                       log_path=SCRATCH / "bench-handlers.log"))

    def fresh(self) -> Any:
        """Empty AWS state (the template's resources provisioned again), Redis and simulator."""
        self.stack.reset()
        return self.stack

    def settings(self) -> Any:
        """The poll function's settings, from the environment the stack set."""
        from sume_poller.poll.poller import PollSettings

        return PollSettings.from_env(os.environ)

    def redis(self) -> Any:
        from sume_poller import runtime

        return runtime.redis_client(self.settings().redis)

    def sume(self) -> Any:
        from sume_poller import runtime

        return runtime.sume_client(self.settings().sume)
