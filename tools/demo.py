"""The demo: run a few hundred Sume jobs through the system locally and show what happened.

    python -m tools.demo [--backend deployed|inprocess] [--jobs 300] [--time-scale 0.1]
                         [--seed 7] [--timeout 600] [--param Key=Value ...]

It starts a local stack (tools.stack): ``deployed`` (default, ``make demo``) builds and deploys
template.yaml into ministack, where the deployed schedule, SQS event source and Lambdas do the
work; ``inprocess`` runs the handlers in this process on moto server, playing the event source
and the schedule. Either way redis-server, the Sume simulator and the AWS side run on free
127.0.0.1 ports and are stopped on exit or Ctrl-C.

``--time-scale`` is the stack's one clock knob: the functions and the simulator both run on it
(0.1: a clock second lasts 0.1 s). The jobs' simulated durations, Sume's hints and the read
budget (the template's 120 reads per clock minute unless ``--param ReadsPerMinute=...``; no
daily cap) are clock time. The run submits jobs of mixed kinds, lengths and outcomes through the submit
function, shows live progress, then a summary. Exit status 1 if a job was lost (not terminal in
time) or finished twice (more than one terminal event).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sume_poller.coverage import CoverageStore
from sume_poller.store import JobStore
from tools.ops import model_lines
from tools.stack import BACKENDS, SetupError, Stack, open_stack

KINDS = ["image", "image", "image", "video", "ad_video", "face_swap", "reference_analysis"]
OUTCOMES = ["completed"] * 14 + ["failed", "failed", "canceled", "expired"]
#: Template parameters of the demo: creates are not limited (300 submissions in seconds would
#: exceed Sume's documented 10 per minute), nor reads per day (the day's budget is paced evenly
#: over the day: at clock scale 0.1, 10,000 a day is 1.2 reads per real second); reads per
#: minute keep the template's 120, and poll concurrency is 8 instead of 5.
DEMO_PARAMETERS = {"CreatesPerMinute": "0", "CreatesPerDay": "0", "ReadsPerDay": "0", "PollMaxConcurrency": "8"}
#: How often the live view reads the table and the metrics (real seconds).
VIEW_EVERY_S = 1.0
#: Finished jobs shown in the live view (every job is listed in JOBS_FILE at the end).
RECENT_ROWS = 6
JOBS_FILE = Path(__file__).resolve().parent.parent / ".scratch" / "demo-jobs.txt"


def plan_jobs(count: int, seed: int) -> list[dict[str, Any]]:
    """Submit events of mixed kinds, lengths and outcomes (the simulator reads ``params.sim``)."""
    rng = random.Random(seed)
    run = uuid.uuid4().hex[:8]
    events = []
    for i in range(count):
        kind = rng.choice(KINDS)
        sim: dict[str, Any] = {"outcome": rng.choice(OUTCOMES), "steps": rng.randint(1, 4),
                               "duration": round(rng.uniform(2, 12) if kind in ("image", "face_swap")
                                                 else rng.uniform(10, 40), 1)}
        if kind == "face_swap":
            sim["count"] = 2
        roll = rng.random()
        if roll < 0.06:
            sim["faults"] = rng.choice([["429:2"], ["503:1"], ["500"], ["malformed"]])
        elif roll < 0.09:
            sim["hints"] = False
        events.append({"kind": kind, "params": {"prompt": f"demo {run} #{i}", "sim": sim},
                       "idempotency_key": f"demo-{run}-{i:04d}"})
    return events


@dataclass
class Summary:
    jobs: int
    by_status: Counter[str]
    status_reads: int
    min_reads: int
    result_reads: int
    events: int
    doubled: list[str]
    lost: list[str]
    dlq: int
    wall: float
    metrics: Counter[str] = field(default_factory=Counter)
    #: Who found the jobs terminal: "chain", "sweep" or "webhook" (each job record says it).
    found_by: Counter[str] = field(default_factory=Counter)
    #: Per kind: the learned completion-time model and what sweeps cover, as (what, value).
    kind_lines: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.doubled and not self.lost

    @property
    def requeues(self) -> int:
        return sum(self.metrics[f"Outcome_{n}"] for n in ("requeued", "transient", "hopped", "result_not_ready"))


def found_by(records: list[dict[str, Any]]) -> Counter[str]:
    """Who found each finished job terminal: its chain, a sweep or a webhook (its record says)."""
    return Counter(str(r.get("found_by") or "chain") for r in records if r.get("status") not in (None, "pending"))


def kind_lines(stack: Stack, records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Per kind (and finer profile), the learned model as the poll function fits it now, and what
    sweeps proved about the kind (chains stretch only where they did)."""
    profiles = {str(r[key]) for r in records for key in ("kind", "profile") if r.get(key)}
    store = JobStore(stack.outputs["JobsTableName"], 1, ddb=stack.client("dynamodb"))
    lines = [(f"model {profile}", text) for profile, text in model_lines(store, profiles, stack.clock.now)]
    client = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        coverage = CoverageStore(client, stack.parameters.get("LeaseKeyPrefix") or "sume:poll:").snapshot(
            stack.clock.now())
    finally:
        client.close()
    for kind in sorted({str(r["kind"]) for r in records if r.get("kind")}):
        covered, misses = coverage.counts.get(kind, (0, 0))
        chains = "stretch to the safety cadence" if coverage.stretches(kind, stack.clock.now()) else "normal schedule"
        lines.append((f"sweeps {kind}", f"{covered} chain finds listed in a row, {misses} misses; chains: {chains}"))
    lines.append(("list route", coverage.route))
    return lines


def write_jobs(records: list[dict[str, Any]], path: Path) -> None:
    """One line per job: id, kind, status, reads, who found it terminal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [f"{r['job_id']}  {r.get('kind', '?'):<18} {r.get('status', '?'):<10} reads {r.get('reads', 0):<3} "
            f"found by {r.get('found_by') or '-'}" for r in sorted(records, key=lambda r: str(r["job_id"]))]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


class View:
    """The live table, refreshed at most every VIEW_EVERY_S (reading the table is not free)."""

    def __init__(self, stack: Stack, job_ids: list[str], live: Live, progress: Progress, task: Any) -> None:
        self.stack, self.job_ids, self.live, self.progress, self.task = stack, job_ids, live, progress, task
        self.started = time.monotonic()
        self.records: list[dict[str, Any]] = []
        self._at = 0.0

    def done(self) -> bool:
        if time.monotonic() - self._at < VIEW_EVERY_S:
            return False
        self._at = time.monotonic()
        self.records = self.stack.records(self.job_ids)
        finished = sum(1 for r in self.records if r.get("status") != "pending")
        self.progress.update(self.task, completed=finished)
        self.live.update(Group(self.progress, self.table()))
        return finished == len(self.job_ids)

    def table(self) -> Table:
        by = Counter(r.get("status", "?") for r in self.records)
        stats, metrics = self.stack.sim.stats(), self.stack.metric_totals()
        table = Table(title=f"sume-poller demo ({self.stack.name}, clock x{1 / self.stack.clock.scale:g})")
        table.add_column("what")
        table.add_column("now", justify="right")
        table.add_row("jobs recorded", f"{len(self.records)} / {len(self.job_ids)}")
        for status in ("pending", "completed", "failed", "canceled", "expired", "timed_out"):
            if by.get(status):
                table.add_row(f"  {status}", str(by[status]))
        table.add_row("Sume status / result reads", f"{stats.get('status_reads', 0)} / {stats.get('result_reads', 0)}")
        table.add_row("429s / budget waits", f"{metrics['SumeThrottled']} / {metrics['BudgetExhausted']}")
        table.add_row("lease contention (dropped)", str(metrics["LeaseContention"]))
        table.add_row("elapsed", f"{time.monotonic() - self.started:.0f} s")
        finished = sorted((r for r in self.records if r.get("status") != "pending"),
                          key=lambda r: float(r.get("terminal_at") or 0))[-RECENT_ROWS:]
        for r in finished:  # the latest finished jobs, and who found each one finished
            table.add_row(f"  {r['job_id']} ({r.get('kind')})",
                          f"{r.get('status')}, {r.get('reads', 0)} reads, by {r.get('found_by') or 'chain'}")
        return table


def run(stack: Stack, count: int, seed: int, timeout: float, console: Console) -> Summary:
    started = time.monotonic()
    job_ids: list[str] = []
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console)
    submitting = progress.add_task("submitted", total=count)
    finishing = progress.add_task("terminal", total=None)
    with Live(Group(progress), console=console, refresh_per_second=4) as live:
        for event in plan_jobs(count, seed):
            reply = stack.submit(event)
            if reply.get("status") == "rejected":
                console.print(f"[red]rejected[/red]: {reply}")
            job_ids.extend(reply.get("job_ids", []))
            progress.advance(submitting)
        progress.update(finishing, total=len(job_ids))
        view = View(stack, job_ids, live, progress, finishing)
        try:
            stack.drive(view.done, timeout=timeout)
        except TimeoutError as error:
            console.print(f"[yellow]{error}[/yellow]")
        # Terminal events follow their records closely: wait (bounded) until every job has one.
        ours = set(job_ids)
        with contextlib.suppress(TimeoutError):  # the summary counts what is missing
            stack.drive(lambda: ours <= {e["job_id"] for e in stack.events()}, timeout=30)
    records = stack.records(job_ids)
    write_jobs(records, JOBS_FILE)
    events = [e for e in stack.events() if e["job_id"] in ours]
    per_job = Counter(e["job_id"] for e in events)
    jobs_stats = {j: s for j, s in stack.sim.stats().get("jobs", {}).items() if j in ours}
    return Summary(
        jobs=len(job_ids),
        by_status=Counter(r.get("status", "?") for r in records),
        status_reads=sum(s["status_reads"] for s in jobs_stats.values()),
        min_reads=sum(s["min_reads"] or 0 for s in jobs_stats.values()),
        result_reads=sum(s["result_reads"] for s in jobs_stats.values()),
        events=len(events),
        doubled=[j for j, n in per_job.items() if n > 1],
        lost=[r["job_id"] for r in records if r.get("status") == "pending"]
        + sorted(ours - {r["job_id"] for r in records}),
        dlq=stack.dlq_depth(),
        wall=time.monotonic() - started,
        metrics=stack.metric_totals(),
        found_by=found_by(records),
        kind_lines=kind_lines(stack, records),
    )


def summary_table(s: Summary) -> Table:
    table = Table(title="summary")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("jobs", str(s.jobs))
    for status, n in sorted(s.by_status.items()):
        table.add_row(f"  {status}", str(n))
    reads = s.status_reads + s.result_reads
    table.add_row("Sume reads per job", f"{reads / s.jobs:.2f}" if s.jobs else "-")
    ratio = f"{s.status_reads / s.min_reads:.3f}" if s.min_reads else "-"
    table.add_row("Sume status reads / simulator's minimum", f"{s.status_reads} / {s.min_reads} = {ratio}")
    completed = s.by_status["completed"]
    table.add_row("Sume result reads / completed jobs (minimum)", f"{s.result_reads} / {completed}")
    table.add_row("429s answered by Sume", str(s.metrics["SumeThrottled"]))
    table.add_row("budget waits (reads deferred to a budget slot)", str(s.metrics["BudgetExhausted"]))
    table.add_row("terminal events / jobs", f"{s.events} / {s.jobs}")
    table.add_row("jobs finished twice (must be 0)", str(len(s.doubled)))
    table.add_row("jobs lost (must be 0)", str(len(s.lost)))
    table.add_row("re-queues", str(s.requeues))
    table.add_row("lease contention (dropped)", str(s.metrics["LeaseContention"]))
    if s.found_by:
        table.add_row("found terminal by", ", ".join(f"{who} {n}" for who, n in s.found_by.most_common()))
    for what, value in s.kind_lines:
        table.add_row(what, value)
    table.add_row("every job and who found it", str(JOBS_FILE.relative_to(JOBS_FILE.parent.parent)))
    table.add_row("DLQ depth", str(s.dlq))
    table.add_row("wall time", f"{s.wall:.1f} s")
    return table


def _sigterm_as_interrupt() -> None:
    """SIGTERM (``timeout``, ``kill PID``) unwinds like Ctrl-C, so everything started is stopped."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum}")
        signal.signal(signal.SIGTERM, interrupt)


def _parameter(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected Key=Value, not {text!r}")
    return key, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKENDS, default="deployed")
    parser.add_argument("--jobs", type=int, default=300, help="submissions (face swap makes 2 jobs each)")
    parser.add_argument("--time-scale", type=float, default=0.1, help="real seconds per clock second (0 < s <= 1)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=600, help="seconds before unfinished jobs count as lost")
    parser.add_argument("--param", type=_parameter, action="append", default=[], metavar="Key=Value",
                        help="a template parameter (repeatable), e.g. ReadsPerMinute=600")
    args = parser.parse_args(argv)
    console = Console()
    _sigterm_as_interrupt()
    parameters = {**DEMO_PARAMETERS, **dict(args.param)}
    try:
        with open_stack(args.backend, time_scale=args.time_scale, parameters=parameters) as stack:
            summary = run(stack, args.jobs, args.seed, args.timeout, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; everything the demo started is stopped[/yellow]")
        return 130
    except SetupError as error:
        console.print(f"[red]{error}[/red]")
        return 2
    console.print(summary_table(summary))
    if not summary.ok:
        console.print(f"[red]FAILED[/red]: lost={summary.lost[:10]} doubled={summary.doubled[:10]}")
        return 1
    console.print("[green]OK[/green]: every job reached exactly one terminal outcome")
    return 0


if __name__ == "__main__":
    sys.exit(main())
