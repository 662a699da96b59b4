"""sume_poller: watch paid Sume jobs until terminal, cheaply and exactly once.

The layer is grouped by capability, one package each, lowest first (a module imports only from
its own package or lower ones; ``tests/unit/test_layer_order.py`` holds the code to this order):

* :mod:`~sume_poller.core` - job facts, the clock, the poll message, logs and metrics, AWS clients
* :mod:`~sume_poller.config` - settings, Sume keys, secrets
* :mod:`~sume_poller.schedule` - how long jobs take, and where the next status read lands
* :mod:`~sume_poller.limits` - Redis: the read budget, leases, the gate before a read
* :mod:`~sume_poller.sume` - the Sume client
* :mod:`~sume_poller.store` - job records, results, submissions, the poll queue, the terminal event
* :mod:`~sume_poller.api` - GetJob and the jobs function's HTTP doors
* :mod:`~sume_poller.discovery` - sweeps and webhooks: finding finished jobs in bulk
* :mod:`~sume_poller.creates` - paid creates: submit, the create queue and its drain
* :mod:`~sume_poller.poll` - the poll path: fan-out, the batch, a chain's step, its outbox
* :mod:`~sume_poller.wiring` - each function's parts, built once per container

Each package's ``__init__`` names its public surface in ``__all__`` and loads a module only when
one of its names is first used (:func:`lazy_exports`), so a function loads only what it runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, modules: dict[str, tuple[str, ...]]) -> tuple[list[str], Callable[[str], Any]]:
    """A package's ``__all__`` and its module ``__getattr__`` (PEP 562) from ``{module: names}``:
    ``from sume_poller.limits import Budget`` imports :mod:`sume_poller.limits.budget` then, not
    every module of the package when the package is imported (a Lambda's cold start pays for what
    it imports)."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return sorted(where), __getattr__
