"""The demo: a few hundred Sume jobs through the system on this machine, shown live, then a summary.

    python -m tools.demo [--backend deployed|inprocess] [--jobs 300] [--time-scale 0.1]
                         [--seed 7] [--timeout 600] [--param Key=Value ...]

``deployed`` (default, ``make demo``): template.yaml built and deployed into ministack, whose schedule, SQS event
source and Lambdas do the work; ``inprocess``: the handlers in this process on moto server. Either way redis-server,
the Sume simulator and the AWS side run on free 127.0.0.1 ports and are stopped on exit or Ctrl-C. ``--time-scale``
is the one clock knob (0.1: a clock second lasts 0.1 s) of the functions and the simulator alike: the jobs'
durations, Sume's hints and the read budget (120 reads a clock minute unless ``--param ReadsPerMinute=...``) are
clock time. Exit status 1 if a job was lost (not terminal in time) or finished twice.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import redis
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from sume_poller.discovery.coverage import CoverageStore
from tools.local_invoke import parse_parameter_overrides
from tools.ops import model_lines
from tools.stack import SetupError, Stack

KINDS = ["image", "image", "image", "video", "ad_video", "face_swap", "reference_analysis"]
OUTCOMES = ["completed"] * 14 + ["failed", "failed", "canceled", "expired"]
#: Template parameters of the demo: creates are not limited (300 submissions in seconds would
#: exceed Sume's documented 10 per minute), nor reads per day (the day's budget is paced evenly
#: over the day: at clock scale 0.1, 10,000 a day is 1.2 reads per real second); reads per
#: minute keep the template's 120, and poll concurrency is 8 instead of 5.
DEMO_PARAMETERS = {"CreatesPerMinute": "0", "CreatesPerDay": "0", "ReadsPerDay": "0", "PollMaxConcurrency": "8"}
#: How often the live view reads the table and the metrics (real seconds); how many of the latest
#: finished jobs it shows (every job is listed in JOBS_FILE at the end).
VIEW_EVERY_S, RECENT_ROWS = 1.0, 6
ROOT = Path(__file__).resolve().parents[1]
JOBS_FILE = ROOT / ".scratch" / "demo-jobs.txt"
STATUSES = ("pending", "completed", "failed", "canceled", "expired", "timed_out")


def plan_jobs(count: int, seed: int) -> list[dict[str, Any]]:
    """Submit events of mixed kinds, lengths and outcomes (the simulator reads ``params.sim``)."""
    rng, run, events = random.Random(seed), uuid.uuid4().hex[:8], []
    for i in range(count):
        kind = rng.choice(KINDS)
        sim: dict[str, Any] = {"outcome": rng.choice(OUTCOMES), "steps": rng.randint(1, 4),
                               "duration": round(rng.uniform(2, 12) if kind in ("image", "face_swap")
                                                 else rng.uniform(10, 40), 1)}
        if kind == "face_swap":
            sim["count"] = 2
        if (roll := rng.random()) < 0.06:
            sim["faults"] = rng.choice([["429:2"], ["503:1"], ["500"], ["malformed"]])
        elif roll < 0.09:
            sim["hints"] = False
        events.append({"kind": kind, "params": {"prompt": f"demo {run} #{i}", "sim": sim},
                       "idempotency_key": f"demo-{run}-{i:04d}"})
    return events


def kind_lines(stack: Stack, records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Per kind (and finer profile), the learned model as the poll function fits it now, and what sweeps proved about
    the kind (chains stretch only where they did)."""
    profiles = {str(r[key]) for r in records for key in ("kind", "profile") if r.get(key)}
    lines = [(f"model {profile}", text) for profile, text in model_lines(stack.table, profiles, stack.clock.now)]
    with redis.Redis.from_url(stack.redis_url, decode_responses=True) as client:
        coverage = CoverageStore(client, stack.parameters.get("LeaseKeyPrefix") or "sume:poll:").snapshot(
            stack.clock.now())
    for kind in sorted({str(r["kind"]) for r in records if r.get("kind")}):
        covered, misses = coverage.counts.get(kind, (0, 0))
        chains = "stretch to the safety cadence" if coverage.stretches(kind, stack.clock.now()) else "normal schedule"
        lines.append((f"sweeps {kind}", f"{covered} chain finds listed in a row, {misses} misses; chains: {chains}"))
    return [*lines, ("list route", coverage.route)]


def table(title: str, rows: list[tuple[str, str]]) -> Table:
    view = Table("what", Column("value", justify="right"), title=title)
    for row in rows:
        view.add_row(*row)
    return view


def live_rows(stack: Stack, job_ids: list[str], records: list[dict[str, Any]], started: float) -> list[tuple[str, str]]:
    """The live view: counts, reads, waits, and the latest finished jobs with who found each."""
    by, stats, metrics = Counter(r.get("status", "?") for r in records), stack.sim.stats(), stack.metric_totals()
    finished = sorted((r for r in records if r.get("status") != "pending"),
                      key=lambda r: float(r.get("terminal_at") or 0))
    return [("jobs recorded", f"{len(records)} / {len(job_ids)}"),
            *((f"  {status}", str(by[status])) for status in STATUSES if by.get(status)),
            ("Sume status / result reads", f"{stats.get('status_reads', 0)} / {stats.get('result_reads', 0)}"),
            ("429s / budget waits", f"{metrics['SumeThrottled']} / {metrics['BudgetExhausted']}"),
            ("lease contention (dropped)", str(metrics["LeaseContention"])),
            ("elapsed", f"{time.monotonic() - started:.0f} s"),
            *((f"  {r['job_id']} ({r.get('kind')})", f"{r.get('status')}, {r.get('reads', 0)} reads, by "
               f"{r.get('found_by') or 'chain'}") for r in finished[-RECENT_ROWS:])]


def run(stack: Stack, count: int, seed: int, timeout: float, console: Console) -> tuple[Table, list[str], list[str]]:
    """Submit, drive and watch the jobs; the summary, the lost jobs and those finished twice."""
    started, job_ids = time.monotonic(), []
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console)
    submitting, finishing = progress.add_task("submitted", total=count), progress.add_task("terminal", total=None)
    with Live(Group(progress), console=console, refresh_per_second=4) as live:
        for event in plan_jobs(count, seed):
            reply = stack.submit(event)
            if reply.get("status") == "rejected":
                console.print(f"[red]rejected[/red]: {reply}")
            job_ids.extend(reply.get("job_ids", []))
            progress.advance(submitting)
        progress.update(finishing, total=len(job_ids))
        seen = {"at": 0.0}

        def done() -> bool:  # the view refreshed at most every VIEW_EVERY_S: reading the table is not free
            if time.monotonic() - seen["at"] < VIEW_EVERY_S:
                return False
            seen["at"], records = time.monotonic(), stack.records(job_ids)
            finished = sum(1 for r in records if r.get("status") != "pending")
            progress.update(finishing, completed=finished)
            title = f"sume-poller demo ({stack.name}, clock x{1 / stack.clock.scale:g})"
            live.update(Group(progress, table(title, live_rows(stack, job_ids, records, started))))
            return finished == len(job_ids)

        try:
            stack.drive(done, timeout=timeout)
        except TimeoutError as error:
            console.print(f"[yellow]{error}[/yellow]")
        # Terminal events follow their records closely: wait (bounded) until every job has one.
        ours = set(job_ids)
        with contextlib.suppress(TimeoutError):  # the summary counts what is missing
            stack.drive(lambda: ours <= {e["job_id"] for e in stack.events()}, timeout=30)
    records = sorted(stack.records(job_ids), key=lambda r: str(r["job_id"]))
    JOBS_FILE.parent.mkdir(parents=True, exist_ok=True)
    JOBS_FILE.write_text("".join(f"{r['job_id']}  {r.get('kind', '?'):<18} {r.get('status', '?'):<10} reads "
                                 f"{r.get('reads', 0):<3} found by {r.get('found_by') or '-'}\n" for r in records))
    per_job = Counter(e["job_id"] for e in stack.events() if e["job_id"] in ours)
    doubled = [j for j, n in per_job.items() if n > 1]
    lost = [r["job_id"] for r in records if r.get("status") == "pending"]
    lost += sorted(ours - {r["job_id"] for r in records})
    jobs = [s for j, s in stack.sim.stats().get("jobs", {}).items() if j in ours]
    status_reads, result_reads = sum(s["status_reads"] for s in jobs), sum(s["result_reads"] for s in jobs)
    minimum, metrics = sum(s["min_reads"] or 0 for s in jobs), stack.metric_totals()
    by_status = Counter(str(r.get("status", "?")) for r in records)
    found_by = Counter(str(r.get("found_by") or "chain") for r in records if r.get("status") != "pending")
    requeues = sum(metrics[f"Outcome_{n}"] for n in ("requeued", "transient", "hopped", "result_not_ready"))
    rows = [("jobs", str(len(job_ids))), *((f"  {status}", str(n)) for status, n in sorted(by_status.items())),
            ("Sume reads per job", f"{(status_reads + result_reads) / len(job_ids):.2f}" if job_ids else "-"),
            ("Sume status reads / simulator's minimum", f"{status_reads} / {minimum} = "
                                                        + (f"{status_reads / minimum:.3f}" if minimum else "-")),
            ("Sume result reads / completed jobs (minimum)", f"{result_reads} / {by_status['completed']}"),
            ("429s answered by Sume", str(metrics["SumeThrottled"])),
            ("budget waits (reads deferred to a budget slot)", str(metrics["BudgetExhausted"])),
            ("terminal events / jobs", f"{sum(per_job.values())} / {len(job_ids)}"),
            ("jobs finished twice (must be 0)", str(len(doubled))), ("jobs lost (must be 0)", str(len(lost))),
            ("re-queues", str(requeues)), ("lease contention (dropped)", str(metrics["LeaseContention"])),
            *([("found terminal by", ", ".join(f"{w} {n}" for w, n in found_by.most_common()))] if found_by else []),
            *kind_lines(stack, records), ("every job and who found it", str(JOBS_FILE.relative_to(ROOT))),
            ("DLQ depth", str(stack.dlq_depth())), ("wall time", f"{time.monotonic() - started:.1f} s")]
    return table("summary", rows), lost, doubled


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM (``timeout``, ``kill PID``) unwinds like Ctrl-C, so everything started is stopped."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["deployed", "inprocess"], default="deployed")
    parser.add_argument("--jobs", type=int, default=300, help="submissions (face swap makes 2 jobs each)")
    parser.add_argument("--time-scale", type=float, default=0.1, help="real seconds per clock second (0 < s <= 1)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=600, help="seconds before unfinished jobs count as lost")
    parser.add_argument("--param", action="append", default=[], metavar="Key=Value",
                        help="a template parameter (repeatable), e.g. ReadsPerMinute=600")
    args = parser.parse_args(argv)
    try:
        parameters = {**DEMO_PARAMETERS, **parse_parameter_overrides(args.param)}
    except ValueError as error:
        parser.error(str(error))
    console = Console()
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
    if args.backend == "inprocess":
        from tools.stack.inprocess import InProcessStack as backend
    else:
        from tools.stack.deployed import DeployedStack as backend  # type: ignore[assignment]
    try:
        with backend(time_scale=args.time_scale, parameters=parameters) as stack:
            summary, lost, doubled = run(stack, args.jobs, args.seed, args.timeout, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; everything the demo started is stopped[/yellow]")
        return 130
    except SetupError as error:
        console.print(f"[red]{error}[/red]")
        return 2
    console.print(summary)
    if lost or doubled:
        console.print(f"[red]FAILED[/red]: lost={lost[:10]} doubled={doubled[:10]}")
        return 1
    console.print("[green]OK[/green]: every job reached exactly one terminal outcome")
    return 0


if __name__ == "__main__":
    sys.exit(main())
