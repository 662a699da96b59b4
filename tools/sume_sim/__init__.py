"""Local Sume API simulator for integration tests, benchmarks and demos.

Start it with ``python -m tools.sume_sim --port 8787`` or embed it::

    from tools.sume_sim import SumeSimulator

    with SumeSimulator(api_key="sume_test_key", time_scale=0.05) as sim:
        client = make_client(base_url=sim.base_url)

See :mod:`tools.sume_sim.server` for the endpoints, ``sim`` directives and the control API.
"""

from tools.sume_sim.server import API_PREFIX, CONTROL_PREFIX, DEFAULT_API_KEY, SpecError, SumeSimulator

__all__ = ["API_PREFIX", "CONTROL_PREFIX", "DEFAULT_API_KEY", "SpecError", "SumeSimulator"]
