"""Command line entry point: ``python -m tools.sume_sim --port 8787 --api-key sume_test_key``.

Prints ``sume-sim listening on http://127.0.0.1:PORT/api/v1`` once bound (``--port 0`` picks a
free port), then serves until SIGTERM or SIGINT and exits with status 0.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from tools.sume_sim.server import DEFAULT_API_KEY, SumeSimulator


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.sume_sim", description="Local Sume API simulator.")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8787, help="port to bind; 0 picks a free one")
    parser.add_argument("--api-key", default=DEFAULT_API_KEY, help="the accepted API key")
    parser.add_argument(
        "--hints",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send terminal/result_ready/next_poll_after_seconds in status replies",
    )
    parser.add_argument("--latency-ms", type=int, default=0, help="latency added to every API request")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiplier for job durations")
    parser.add_argument("--rate-limit-per-minute", type=int, default=None, help="enforce a read limit")
    parser.add_argument("--seed", type=int, default=None, help="seed for random fault injection")
    parser.add_argument(
        "--exact-hints", action="store_true", help="report exact (sub-second) next_poll_after_seconds"
    )
    parser.add_argument("--verbose", action="store_true", help="log one line per request to stderr")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sim = SumeSimulator(
        api_key=args.api_key,
        hints=args.hints,
        latency_ms=args.latency_ms,
        time_scale=args.time_scale,
        rate_limit_per_minute=args.rate_limit_per_minute,
        seed=args.seed,
        exact_hints=args.exact_hints,
        host=args.host,
        log_requests=args.verbose,
    )
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    sim.start(port=args.port)
    print(f"sume-sim listening on {sim.base_url}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
