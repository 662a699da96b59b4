"""The local parts every in-process figure runs against, started once per bench run.

A redis-server and a moto server of our own (child processes on free ports, stopped by PID on
exit), the Sume simulator, and :class:`tools.localrun.LocalSystem` (the template's table and
queues provisioned in moto, the functions' environment set in this process).
"""

from __future__ import annotations

import os
import uuid
from contextlib import ExitStack
from functools import cached_property
from pathlib import Path
from typing import Any

import redis

from bench import SCRATCH

API_KEY = "sume_bench_" + uuid.uuid4().hex
BENCH_BUS = "sume-poller-bench"

#: Short leases (like tests/conftest.py) so a crashed poller's job is resumed within seconds.
ENV_OVERRIDES = {
    "LEASE_MARGIN_SECONDS": "2",
    "CLAIM_TTL_SECONDS": "2",
    "SUME_CONNECT_TIMEOUT": "1",
    "SUME_READ_TIMEOUT": "2",
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_METRICS_NAMESPACE": "SumePollerBench",
}


class Services:
    def __init__(self, stack: ExitStack, log_path: Path = SCRATCH / "bench-handlers.log") -> None:
        self._stack = stack
        self.log_path = log_path

    @cached_property
    def redis_server(self) -> Any:
        from tools.services import RedisServer
        return self._stack.enter_context(RedisServer())

    @cached_property
    def moto(self) -> Any:
        from tools.services import MotoServer
        return self._stack.enter_context(MotoServer())

    @cached_property
    def sim(self) -> Any:
        from tools.sume_sim import SumeSimulator
        return self._stack.enter_context(SumeSimulator(api_key=API_KEY, hints=True))

    @cached_property
    def system(self) -> Any:
        from tools.localrun import LocalSystem

        system = LocalSystem(self.moto.endpoint_url, self.redis_server.url, self.sim.base_url, api_key=API_KEY,
                             env_overrides=ENV_OVERRIDES)
        # Handler logs (JSON, one line per poll) go to a file, not over the table.
        from sume_poller.observability import logger
        SCRATCH.mkdir(exist_ok=True)
        log_file = self._stack.enter_context(open(self.log_path, "a"))  # noqa: SIM115
        for handler in logger.handlers:
            if hasattr(handler, "setStream"):
                handler.setStream(log_file)
        return system

    def fresh(self) -> None:
        """Empty AWS state (template resources provisioned again), empty Redis, fresh simulator."""
        system = self.system
        system.fresh()
        # The bench's overrides whatever fresh() restores (before f1d0fb5 it put the template's
        # LEASE_MARGIN_SECONDS=30 / CLAIM_TTL_SECONDS=60 back over them).
        os.environ.update(ENV_OVERRIDES)
        system.events.create_event_bus(Name=BENCH_BUS)
        self.sim.reset()
        redis.Redis.from_url(self.redis_server.url).flushall()
        from sume_poller import runtime
        runtime.reset()
        runtime.redis_client().connection_pool.reset()

    def bus(self) -> Any:
        from bench.harness import CountingBus
        return CountingBus(BENCH_BUS, self.system.events)
