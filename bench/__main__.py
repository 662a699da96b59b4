"""python -m bench [--quick] [--only 1,2,...] - sume-poller's benchmarks.

Every figure is a ratio measured side by side with its baseline in this run. Run from the repo
root with the project's virtualenv (``make bench``). It starts what it needs (redis-server, moto
server, the Sume simulator; ministack for figures 5c and 6) on free 127.0.0.1 ports and stops it
on exit. Results: the table on stdout and as Markdown in .scratch/bench-results.md; the layer's
log lines go to .scratch/bench-*.log.

Figures (column "ratio" is the number the target applies to):
  1a/1b/1c  Sume status reads per job / the simulator's minimum, with the lease vs without, under
            duplicate delivery / fan-out ticks over live chains / crashing invocations
  2         Redis round trips per poll (server-side), vs redis-py's Lock
  3         one 10-message batch / one Sume read (200 ms), vs Powertools' batch processors
  4         every function's cold start / floor (import boto3, redis, urllib3 + 2 clients), side by
            side in one run (poll's is the target); layer size
  5a-5d     fan-out: SendMessageBatch calls / minimum, Redis round trips / pages, throughput / raw loop; the
            pending jobs one tick covers within its period
  6         end to end, the template deployed into ministack (tools.stack's deployed backend)
  7         the learned read schedule: reads and delays vs static / optimum, and under a binding budget
            (a model-level simulation, bench/fig_schedule.py; needs bench/requirements.txt)
  8         the shared read budget: served and refused reads per window, the max gap and Redis round
            trips (a virtual clock), and 60 short jobs against a Sume allowing 40 reads a minute on the
            whole system - each vs the limiter off
  9         list sweeps: reads per job with sweeps / chains only, with many jobs pending and with too
            few for sweeps to pay (they then do not run)
  10        how many jobs one key serves at Sume's 120/min and 10,000/day: capacity by bisection (chains
            only, sweeps, webhooks) against the limit, 1,000 pending long jobs, two list-miss modes,
            bursts against the day budget (a virtual clock, bench/fig_capacity.py)
  11        bursts: 300 submissions at once on a key at Sume's create limits (10/min, 300/day), queued and
            created in arrival order: refused, created twice, order, creates per minute, 429s (a virtual
            clock, bench/fig_burst.py)
  keys      one deployment serving many Sume keys: four keys' served/budget and 429s/attempts in one run,
            and a key's p95 detection delay beside a key with 1,000 pending jobs / alone (a virtual
            clock, bench/fig_keys.py)
  cost      dollars per 1,000 jobs and a month at 1,000 / 10,000 / 100,000 jobs a day, every billable call
            counted on the in-process stack and priced at AWS's us-east-1 prices, per deployment (ElastiCache
            Serverless, a node, a hosted Redis) beside Step Functions Standard and a scheduled Lambda over a
            due-time index (bench/fig_cost.py)
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from bench import ROOT, SCRATCH
from bench.report import Row, environment_line, failed, markdown, now_utc, print_table, unavailable

FIGURES = ("1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "keys", "cost")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smaller runs (about 6 min instead of 10 on 2 cores): 60 jobs for figure 1, fewer "
                        "trials and shorter runs elsewhere, 40 submissions end to end")
    p.add_argument("--jobs", type=int, help="jobs per figure-1 run (default 200, --quick 60)")
    p.add_argument("--only", default=",".join(FIGURES),
                   help="figures to run, e.g. 1,2 or 1a,1c,4 or keys (default: all)")
    p.add_argument("--seed", type=int, default=7, help="job plans, duplicate and crash choices")
    p.add_argument("--fanout-every", type=float, default=3.0, help="fan-out tick in figures 1b/1c (s)")
    p.add_argument("--crash-rate", type=float, default=0.05, help="share of crashing invocations in 1c")
    p.add_argument("--arrival-rate", type=float, default=20.0, help="figure-1 jobs starting per second")
    p.add_argument("--concurrency", type=int, default=3, help="concurrent poll invocations in figure 1")
    p.add_argument("--crash-lease-seconds", type=int, default=5,
                   help="lease margin, claim and start TTL in 1c (1a/1b use the function's settings)")
    p.add_argument("--cold-runs", type=int,
                   help="rounds in figure 4, each a fresh interpreter of the floor and of every function "
                        "(default 21, --quick 15: a round's ratios spread by about +-8 %% on this shared machine, "
                        "so 5 rounds' median moved by +-0.05)")
    p.add_argument("--fanout-jobs", type=int, default=500, help="N pending jobs in figure 5")
    p.add_argument("--fanout-leased", type=int, default=100, help="K of them holding a live lease")
    p.add_argument("--e2e-jobs", type=int, help="submissions in figure 6 (default 100, --quick 40)")
    p.add_argument("--skip-e2e", action="store_true", help="do not run figure 6 (no ministack deploy)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds one figure-1 run may take")
    p.add_argument("--markdown", default=str(SCRATCH / "bench-results.md"), help="where to write the Markdown table")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    return p


def _selected(only: str) -> dict[str, str]:
    """{"1": "abc", "2": "", ...} from "1a,1c,2"."""
    chosen: dict[str, str] = {}
    for part in (p.strip() for p in only.split(",") if p.strip()):
        figure, sub = (part, "") if part in FIGURES else re.fullmatch(r"(\d*)(.*)", part).groups()  # type: ignore[union-attr]
        if figure not in FIGURES or (sub and (figure != "1" or set(sub) - set("abc"))):
            raise SystemExit(f"unknown figure {part!r}; figures are {', '.join(FIGURES)} (1a, 1b, 1c for one of 1)")
        chosen[figure] = chosen.get(figure, "") + (sub or "abc")
    return chosen


def _guard(rows: list[Row], title: str, target: str, fn: Callable[[], list[Row]]) -> None:
    """Run one figure; an exception becomes an "error" row (traceback in .scratch/bench-errors.log)."""
    started = time.monotonic()
    print(f"[bench] {title} ...", file=sys.stderr, flush=True)
    try:
        rows.extend(fn())
    except Exception as exc:  # one figure failing must not lose the others
        with open(SCRATCH / "bench-errors.log", "a") as log:
            log.write(traceback.format_exc())
        rows.append(failed(title, target, exc))
    print(f"[bench] {title}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, chosen: dict[str, str]) -> list[Row]:
    """The chosen figures, in an order that keeps them apart: the two without services first (4
    while nothing else of ours runs), those on the shared scale-1 stack, those that start stacks of
    their own (other clock scales), and the ministack deploy last."""
    quick = args.quick
    jobs = args.jobs or (60 if quick else 200)
    rows: list[Row] = []
    if "7" in chosen:
        from bench import fig_schedule
        _guard(rows, "7 learned schedule", "see 7", lambda: fig_schedule.measure(quick=quick, seed=args.seed))
    if "4" in chosen:
        from bench import fig_cold
        _guard(rows, "4 cold start", f"<= {fig_cold.TARGET}",
               lambda: fig_cold.measure(runs=args.cold_runs or (15 if quick else 21)))

    with ExitStack() as stack:
        from bench.services import Services
        svc = Services(stack)
        if "2" in chosen:
            from bench import fig_redis
            _guard(rows, "2 Redis round trips per poll", f"<= {fig_redis.TARGET}", lambda: fig_redis.measure(svc))
        if "3" in chosen:
            from bench import fig_batch
            _guard(rows, "3 batch concurrency", f"<= {fig_batch.TARGET}",
                   lambda: fig_batch.measure(svc, trials=3 if quick else 5))
        if "5" in chosen:
            from bench import fig_fanout
            _guard(rows, "5 fan-out", "see 5a-5d", lambda: fig_fanout.measure(
                svc, n=args.fanout_jobs, k=args.fanout_leased, trials=5, seed=args.seed))
        if "1" in chosen:
            from bench import fig_reads
            _guard(rows, f"1 read amplification ({jobs} jobs per run)", f"<= {fig_reads.TARGET}",
                   lambda: fig_reads.measure(svc, n=jobs, seed=args.seed, fanout_every=args.fanout_every,
                                             crash_rate=args.crash_rate, timeout=args.timeout,
                                             arrival_rate=args.arrival_rate, crash_lease=args.crash_lease_seconds,
                                             concurrency=args.concurrency, only=chosen["1"]))

    if "8" in chosen:
        from bench import fig_budget
        _guard(rows, "8 read budget", "see 8", lambda: fig_budget.measure(quick=quick))
    if "9" in chosen:
        from bench import fig_discovery
        _guard(rows, "9 list sweeps", "see 9", lambda: fig_discovery.measure(quick=quick, seed=args.seed))
    if "10" in chosen:
        from bench import fig_capacity
        _guard(rows, "10 key capacity", "see 10", lambda: fig_capacity.measure(quick=quick, seed=args.seed))
    if "11" in chosen:
        from bench import fig_burst
        _guard(rows, "11 bursts", "see 11", lambda: fig_burst.measure(quick=quick))
    if "keys" in chosen:
        from bench import fig_keys
        _guard(rows, "keys many keys", "see keys", lambda: fig_keys.measure(quick=quick, seed=args.seed))
    if "cost" in chosen:
        from bench import fig_cost
        _guard(rows, "cost per job", f"<= {fig_cost.TARGET}", lambda: fig_cost.measure(quick=quick, seed=args.seed))
    if "6" in chosen:
        from bench import fig_e2e
        if args.skip_e2e:
            rows.append(unavailable(fig_e2e.TITLE, f"<= {fig_e2e.TARGET}", "skipped (--skip-e2e)"))
        else:
            _guard(rows, "6 end to end (ministack)", f"<= {fig_e2e.TARGET}",
                   lambda: fig_e2e.measure(n=args.e2e_jobs or (40 if quick else 100), seed=args.seed, timeout=600.0))
    return rows


def _figure_key(row: Row) -> tuple[int, str]:
    """Rows in figure order (1a, 1b, ..., 10, then the named ones); a figure's rows keep their order."""
    match = re.match(r"(\d+)([a-z]?)", row.figure)
    if match:
        return int(match[1]), match[2]
    name = row.figure.split(" ", 1)[0]
    return (len(FIGURES) + FIGURES.index(name), "") if name in FIGURES else (2 * len(FIGURES), row.figure)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    chosen = _selected(args.only)
    SCRATCH.mkdir(exist_ok=True)
    started_at, started = now_utc(), time.monotonic()
    rows = _run(args, chosen)
    rows.sort(key=_figure_key)
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    footer = [
        f"How to reproduce: `{command.strip()}` from the repo root ({ROOT.name}), or `make bench` "
        "(BENCH_ARGS=\"--quick\" for a shorter run).",
        f"Run: {environment_line(started_at, time.monotonic() - started, str(ROOT))}"
        + (" (--quick)" if args.quick else "") + f"; seed {args.seed}.",
    ]
    title = "sume-poller benchmarks: each ratio measured side by side with its baseline in one run"
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
