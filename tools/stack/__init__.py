"""The local stack: template.yaml running on this machine behind one interface (base.Stack).

    from tools.stack.inprocess import InProcessStack   # or tools.stack.deployed.DeployedStack

    with InProcessStack(time_scale=0.05) as stack:
        reply = stack.submit({"kind": "image", "params": {"prompt": "a cat"}})
        stack.drive(lambda: stack.settled(reply["job_ids"]), timeout=60)
        stack.records(reply["job_ids"]), stack.events(), stack.metric_totals()

Backends: ``inprocess`` (tools/stack/inprocess.py: handlers in this process on moto server)
and ``deployed`` (tools/stack/deployed.py: sam build + sam deploy into ministack).
"""

from tools.stack.base import LOCAL_PARAMETERS, SetupError, Stack

__all__ = ["LOCAL_PARAMETERS", "SetupError", "Stack"]
