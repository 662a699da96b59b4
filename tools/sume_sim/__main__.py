"""Command line entry point: ``python -m tools.sume_sim --port 8787 --api-key sume_test_key``.

Prints ``sume-sim listening on http://127.0.0.1:PORT/api/v1`` once bound (``--port 0`` picks a
free port), then serves until SIGTERM or SIGINT and exits with status 0. Every time flag is in
clock seconds; ``--time-scale`` sets the clock (0.01: a clock second lasts 10 ms).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

try:
    import sume_poller.core.clock  # noqa: F401 - only checks that the project's clock is importable
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "layers" / "sume_poller"))

from tools.sume_sim import DEFAULT_API_KEY, SpecError, SumeSimulator


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.sume_sim", description="Local Sume API simulator.")
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    add("--port", type=int, default=8787, help="port to bind; 0 picks a free one")
    add("--api-key", default=DEFAULT_API_KEY, help="the default workspace's API key")
    add("--hints", action=argparse.BooleanOptionalAction, default=True,
        help="send terminal/result_ready/next_poll_after_seconds in status replies")
    add("--exact-hints", action="store_true", help="report exact (ms) next_poll_after_seconds")
    add("--latency-ms", type=int, default=0, help="real latency added to every API request")
    add("--time-scale", type=float, default=1.0, help="clock scale in (0, 1]: real seconds per clock second")
    add("--seed", type=int, default=None, help="seed for every random choice")
    add("--error-rate-5xx", type=float, default=0.0, help="share of status reads answered 500/503")
    add("--malformed-rate", type=float, default=0.0, help="share of status reads with a truncated body")
    add("--rate-limit-per-minute", type=int, default=None, help="alias of --read-per-minute")
    add("--read-per-minute", type=int, default=None, help="enforce a per-minute read budget")
    add("--read-per-day", type=int, default=None, help="enforce a per-day read budget")
    add("--create-per-minute", type=int, default=None, help="enforce a per-minute create budget")
    add("--create-per-day", type=int, default=None, help="enforce a per-day create budget")
    add("--budget-windows", type=_json_object, default=None, metavar="JSON",
        help='how each budget window counts, e.g. \'{"minute": "sliding", "day": "fixed"}\' (default fixed)')
    add("--other-consumer-share", type=float, default=0.0,
        help="share of each enforced read window another client of the key spends")
    add("--not-found-for", type=float, default=0.0, help="read-after-create 404 lag of new jobs")
    add("--key-forbidden", action="store_true", help="answer every public call 403 forbidden")
    add("--result-not-ready", type=int, choices=(404, 409, 425), default=409,
        help="status of a result read before the result is ready (default 409)")
    add("--list", type=_json_object, default=None, metavar="JSON",
        help='list mode, e.g. \'{"fields": "full", "order": "newest_first", "cursor": true}\'')
    add("--webhooks", type=_json_object, default=None, metavar="JSON",
        help='webhooks, e.g. \'{"kinds": ["video"], "secret": "s", "loss": 0.1}\'')
    add("--keys", type=_json_object, default=None, metavar="JSON",
        help='more API keys, e.g. \'{"sume_key_b": {"workspace": "b", "read_budget": {"per_minute": 60}}}\'')
    add("--verbose", action="store_true", help="log one line per request to stderr")
    return parser


def make_simulator(args: argparse.Namespace) -> SumeSimulator:
    return SumeSimulator(
        api_key=args.api_key,
        hints=args.hints,
        latency_ms=args.latency_ms,
        time_scale=args.time_scale,
        error_rate_5xx=args.error_rate_5xx,
        malformed_rate=args.malformed_rate,
        rate_limit_per_minute=args.rate_limit_per_minute,
        seed=args.seed,
        exact_hints=args.exact_hints,
        host=args.host,
        log_requests=args.verbose,
        read_budget={"per_minute": args.read_per_minute, "per_day": args.read_per_day},
        create_budget={"per_minute": args.create_per_minute, "per_day": args.create_per_day},
        budget_windows=args.budget_windows,
        other_consumer_share=args.other_consumer_share,
        not_found_for=args.not_found_for,
        key_forbidden=args.key_forbidden,
        result_not_ready=args.result_not_ready,
        list_config=args.list,
        webhooks=args.webhooks,
        keys=args.keys,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        sim = make_simulator(args)
    except (SpecError, ValueError) as exc:
        parser.error(str(exc))
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
