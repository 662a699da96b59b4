"""The local stack: template.yaml running on this machine behind one interface (base.Stack).

    from tools.stack import open_stack

    with open_stack("inprocess", time_scale=0.05) as stack:   # or "deployed" (ministack)
        reply = stack.submit({"kind": "image", "params": {"prompt": "a cat"}})
        stack.drive(lambda: stack.settled(reply["job_ids"]), timeout=60)
        stack.records(reply["job_ids"]), stack.events(), stack.metric_totals()

Backends: ``inprocess`` (tools/stack/inprocess.py: handlers in this process on moto server)
and ``deployed`` (tools/stack/deployed.py: sam build + sam deploy into ministack).
"""

from __future__ import annotations

from typing import Any

from tools.stack.base import LOCAL_PARAMETERS, SetupError, Stack

BACKENDS = ("deployed", "inprocess")


def open_stack(backend: str, **options: Any) -> Stack:
    """A stack of ``backend`` (not started: use it as a context manager)."""
    if backend == "inprocess":
        from tools.stack.inprocess import InProcessStack

        return InProcessStack(**options)
    if backend == "deployed":
        from tools.stack.deployed import DeployedStack

        return DeployedStack(**options)
    raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")


__all__ = ["BACKENDS", "LOCAL_PARAMETERS", "SetupError", "Stack", "open_stack"]
