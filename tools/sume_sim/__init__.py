"""Local Sume API simulator for integration tests, benchmarks and the demo.

Start it with ``python -m tools.sume_sim --port 8787`` or embed it::

    from tools.sume_sim import SumeSimulator

    with SumeSimulator(api_key="sume_test_key", time_scale=0.05) as sim:
        client = make_client(base_url=sim.base_url)

``README.md`` next to this file describes the endpoints, ``sim`` directives, config and control
API. ``SumeSimulator`` is imported on first use, so that the CLI can put the project's clock
module on ``sys.path`` first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tools.sume_sim.config import DEFAULT_API_KEY
from tools.sume_sim.http import API_PREFIX, CONTROL_PREFIX
from tools.sume_sim.spec import SpecError

if TYPE_CHECKING:
    from tools.sume_sim.simulator import SumeSimulator

__all__ = ["API_PREFIX", "CONTROL_PREFIX", "DEFAULT_API_KEY", "SpecError", "SumeSimulator"]


def __getattr__(name: str) -> Any:
    if name == "SumeSimulator":
        from tools.sume_sim.simulator import SumeSimulator

        return SumeSimulator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
