"""python -m bench [--quick] [--jobs N] [--only 1,2,...] - sume-poller's benchmarks (issue #4).

Every figure is a ratio measured side by side with its baseline in this run. Run from the repo
root with the project's virtualenv (``make bench``). It starts what it needs (redis-server, moto
server, the Sume simulator; ministack for figure 6) on free 127.0.0.1 ports and stops it on exit.
Results: the table on stdout and as Markdown in .scratch/bench-results.md.

Figures (column "ratio" is the number the target applies to):
  1a/1b/1c  Sume status reads per job / the simulator's minimum, with the lease vs without, under
            duplicate delivery / fan-out ticks over live chains / crashing invocations
  2         Redis round trips per poll (server-side), vs redis-py's Lock
  3         one 10-message batch / one Sume read (200 ms), vs sequential
  4         poll function cold start / floor (import boto3, redis, urllib3 + 2 clients); layer size
  5a/5b/5c  fan-out: SendMessageBatch calls / minimum, Redis round trips / pages, throughput / raw loop
  6         end to end in ministack (when tools.ministack provides MinistackBackend)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from bench import ROOT, SCRATCH
from bench.report import Row, environment_line, failed, markdown, now_utc, print_table

FIGURES = ("1", "2", "3", "4", "5", "6")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smaller runs (~4 min instead of ~6 on 2 busy cores): 100 jobs for figure 1, fewer "
                        "trials, 40 submissions end to end")
    p.add_argument("--jobs", type=int, help="jobs per figure-1 run (default 200, --quick 100)")
    p.add_argument("--only", default=",".join(FIGURES),
                   help="figures to run, e.g. 1,2 or 1a,1c,4 (default: all)")
    p.add_argument("--seed", type=int, default=7, help="job plan, duplicate and crash choices")
    p.add_argument("--fanout-every", type=float, default=3.0, help="fan-out tick in figures 1b/1c (s)")
    p.add_argument("--crash-rate", type=float, default=0.05, help="share of crashing invocations in 1c")
    p.add_argument("--arrival-rate", type=float, default=20.0, help="figure-1 jobs starting per second")
    p.add_argument("--concurrency", type=int, default=3, help="concurrent poll invocations in figure 1")
    p.add_argument("--crash-lease-seconds", type=int, default=5,
                   help="LEASE_MARGIN_SECONDS and CLAIM_TTL_SECONDS in 1c (1a/1b use production's 30 / 60)")
    p.add_argument("--cold-runs", type=int, help="fresh interpreters per side in figure 4 (default 9, --quick 5)")
    p.add_argument("--fanout-jobs", type=int, default=500, help="N pending jobs in figure 5")
    p.add_argument("--fanout-leased", type=int, default=100, help="K of them holding a live lease")
    p.add_argument("--e2e-jobs", type=int, help="submissions in figure 6 (default 100, --quick 40)")
    p.add_argument("--skip-e2e", action="store_true", help="do not run figure 6 even if ministack is available")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds one figure-1 run may take")
    p.add_argument("--markdown", default=str(SCRATCH / "bench-results.md"), help="where to write the Markdown table")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    return p


def _selected(only: str) -> dict[str, str]:
    """{"1": "abc", "2": "", ...} from "1a,1c,2"."""
    chosen: dict[str, str] = {}
    for part in (p.strip() for p in only.split(",") if p.strip()):
        figure, sub = part[0], part[1:]
        if figure not in FIGURES:
            raise SystemExit(f"unknown figure {part!r}; figures are {', '.join(FIGURES)}")
        chosen[figure] = chosen.get(figure, "") + (sub or "abc")
    return chosen


def _guard(rows: list[Row], title: str, target: str, fn: Callable[[], list[Row]]) -> None:
    started = time.monotonic()
    print(f"[bench] {title} ...", file=sys.stderr, flush=True)
    try:
        rows.extend(fn())
    except Exception as exc:  # one figure failing must not lose the others
        with open(SCRATCH / "bench-errors.log", "a") as log:
            log.write(traceback.format_exc())
        rows.append(failed(title, target, exc))
    print(f"[bench] {title}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    chosen = _selected(args.only)
    jobs = args.jobs or (100 if args.quick else 200)
    cold_runs = args.cold_runs or (5 if args.quick else 9)
    trials = 3 if args.quick else 5
    e2e_jobs = args.e2e_jobs or (40 if args.quick else 100)
    SCRATCH.mkdir(exist_ok=True)
    environment = dict(os.environ)  # LocalSystem changes this process's environment (AWS_ENDPOINT_URL...)
    started_at, started = now_utc(), time.monotonic()
    rows: list[Row] = []

    if "4" in chosen:  # first, while nothing else of ours runs
        from bench import fig_cold
        _guard(rows, "4 cold start", "<= 1.3", lambda: fig_cold.measure(runs=cold_runs))

    with ExitStack() as stack:
        from bench.services import Services
        svc = Services(stack)
        if "2" in chosen:
            from bench import fig_redis
            _guard(rows, "2 Redis round trips per poll", "<= 2", lambda: [fig_redis.measure(svc)])
        if "3" in chosen:
            from bench import fig_batch
            _guard(rows, "3 batch concurrency", "<= 1.5", lambda: [fig_batch.measure(svc, trials=trials)])
        if "5" in chosen:
            from bench import fig_fanout
            _guard(rows, "5 fan-out", "see 5a-5c", lambda: fig_fanout.measure(
                svc, n=args.fanout_jobs, k=args.fanout_leased, trials=1 if args.quick else 3, seed=args.seed))
        if "1" in chosen:
            from bench import fig_reads
            _guard(rows, f"1 read amplification ({jobs} jobs per run)", "<= 1.02", lambda: fig_reads.measure(
                svc, n=jobs, seed=args.seed, fanout_every=args.fanout_every, crash_rate=args.crash_rate,
                timeout=args.timeout, arrival_rate=args.arrival_rate, crash_lease_seconds=args.crash_lease_seconds,
                concurrency=args.concurrency, only=chosen["1"]))

    os.environ.clear()  # back to how it started: ministack's children inherit it
    os.environ.update(environment)
    if "6" in chosen:
        from bench import fig_e2e
        if args.skip_e2e:
            from bench.report import unavailable
            rows.append(unavailable(fig_e2e.TITLE, "<= 1.02", "skipped (--skip-e2e)"))
        else:
            _guard(rows, "6 end to end (ministack)", "<= 1.02",
                   lambda: [fig_e2e.measure(n=e2e_jobs, seed=args.seed, timeout=600.0)])

    rows.sort(key=lambda r: r.figure.split(" ", 1)[0])
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    footer = [
        f"How to reproduce: `{command.strip()}` from the repo root ({ROOT.name}), or `make bench` "
        "(BENCH_ARGS=\"--quick\" for a shorter run).",
        f"Run: {environment_line(started_at, time.monotonic() - started, str(ROOT))}. Figure 1: {jobs} jobs per run "
        f"(x2: with and without the lease) per scenario; seed {args.seed}.",
    ]
    title = "sume-poller benchmarks (issue #4): each ratio measured side by side with its baseline in one run"
    print_table(rows, title, footer)
    path = Path(args.markdown)
    path = path if path.is_absolute() else ROOT / path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(rows, title, footer))
    print(f"Markdown table written to {path}", file=sys.stderr)
    missed = [r for r in rows if r.passed is False or r.verdict == "error"]
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
