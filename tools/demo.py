"""The demo: run a few hundred Sume jobs through the system locally and show what happened.

    python -m tools.demo [--backend ministack|handlers] [--jobs 300] [--time-scale 0.15] [--seed 7]

Backends:

* ``ministack`` (default, ``make demo``): ``sam build`` + ``sam deploy`` of template.yaml into
  ministack; the deployed schedule, SQS event source and Lambdas do the work (tools.ministack).
* ``handlers``: the template's handlers invoked in-process against moto server, with this
  process playing the SQS event source and the schedule (tools.localrun). No deploy step.

Both start what they need (redis-server, the Sume simulator, moto or ministack) on free
127.0.0.1 ports and stop it on exit or Ctrl-C. The run submits jobs of mixed kinds, lengths and
outcomes through the submit function, shows live progress, then a summary. Exit status 1 if a
job was lost (not terminal in time) or finished twice (more than one terminal event).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

KINDS = ["image", "image", "image", "video", "ad_video", "face_swap", "reference_analysis"]
OUTCOMES = ["completed"] * 14 + ["failed", "failed", "canceled", "expired"]


class Backend(Protocol):
    name: str

    def submit(self, event: dict[str, Any]) -> dict[str, Any]: ...
    def tick(self) -> None: ...
    def records(self) -> list[dict[str, Any]]: ...
    def events(self) -> list[dict[str, Any]]: ...
    def dlq_depth(self) -> int: ...
    def counters(self) -> dict[str, int]: ...
    def sim_stats(self) -> dict[str, Any]: ...


@dataclass
class Plan:
    events: list[dict[str, Any]]
    min_reads: int = 0


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
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.doubled and not self.lost


def _status_table(records: list[dict[str, Any]], expected: int, backend: Backend, started: float) -> Table:
    by = Counter(r.get("status", "?") for r in records)
    stats = backend.sim_stats()
    counters = backend.counters()
    table = Table(title=f"sume-poller demo ({backend.name})", expand=False)
    table.add_column("what")
    table.add_column("now", justify="right")
    table.add_row("jobs recorded", f"{len(records)} / {expected}")
    for status in ("pending", "completed", "failed", "canceled", "expired", "timed_out"):
        if by.get(status):
            table.add_row(f"  {status}", str(by[status]))
    table.add_row("Sume status reads", str(stats.get("status_reads", 0)))
    table.add_row("Sume result reads", str(stats.get("result_reads", 0)))
    table.add_row("re-queues", str(counters.get("requeues", 0)))
    table.add_row("lease contention (dropped)", str(counters.get("contention", 0)))
    table.add_row("elapsed", f"{time.monotonic() - started:.0f} s")
    return table


def run(backend: Backend, count: int, seed: int, timeout: float, console: Console) -> Summary:
    started = time.monotonic()
    plan = plan_jobs(count, seed)
    job_ids: list[str] = []
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console)
    submitting = progress.add_task("submitted", total=len(plan))
    finishing = progress.add_task("terminal", total=None)
    with Live(Group(progress), console=console, refresh_per_second=4) as live:
        for event in plan:
            reply = backend.submit(event)
            if reply.get("status") == "rejected":
                console.print(f"[red]rejected[/red]: {reply}")
            job_ids.extend(reply.get("job_ids", []))
            progress.advance(submitting)
        progress.update(finishing, total=len(job_ids))
        deadline = time.monotonic() + timeout
        records: list[dict[str, Any]] = []
        while True:
            backend.tick()
            records = [r for r in backend.records() if r["job_id"] in set(job_ids)]
            done = sum(1 for r in records if r.get("status") != "pending")
            progress.update(finishing, completed=done)
            live.update(Group(progress, _status_table(records, len(job_ids), backend, started)))
            if done == len(job_ids) or time.monotonic() > deadline:
                break
    wall = time.monotonic() - started
    events = backend.events()
    per_job = Counter(e["job_id"] for e in events)
    stats = backend.sim_stats()
    ours = set(job_ids)
    jobs_stats = {j: s for j, s in stats.get("jobs", {}).items() if j in ours}
    return Summary(
        jobs=len(job_ids),
        by_status=Counter(r.get("status", "?") for r in records),
        status_reads=sum(s["status_reads"] for s in jobs_stats.values()),
        min_reads=sum(s["min_reads"] for s in jobs_stats.values()),
        result_reads=sum(s["result_reads"] for s in jobs_stats.values()),
        events=sum(per_job.values()),
        doubled=[j for j, n in per_job.items() if n > 1],
        lost=[r["job_id"] for r in records if r.get("status") == "pending"]
        + sorted(ours - {r["job_id"] for r in records}),
        dlq=backend.dlq_depth(),
        wall=wall,
        counters=backend.counters(),
    )


def summary_table(s: Summary) -> Table:
    table = Table(title="summary")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("jobs", str(s.jobs))
    for status, n in sorted(s.by_status.items()):
        table.add_row(f"  {status}", str(n))
    ratio = s.status_reads / s.min_reads if s.min_reads else float("nan")
    table.add_row("Sume status reads / schedule minimum", f"{s.status_reads} / {s.min_reads} = {ratio:.3f}")
    table.add_row("Sume result reads", str(s.result_reads))
    table.add_row("terminal events / jobs", f"{s.events} / {s.jobs}")
    table.add_row("jobs finished twice (must be 0)", str(len(s.doubled)))
    table.add_row("jobs lost (must be 0)", str(len(s.lost)))
    table.add_row("re-queues", str(s.counters.get("requeues", 0)))
    table.add_row("lease contention (dropped)", str(s.counters.get("contention", 0)))
    table.add_row("DLQ depth", str(s.dlq))
    table.add_row("wall time", f"{s.wall:.1f} s")
    return table


@contextmanager
def handlers_backend(time_scale: float, stack: ExitStack) -> Iterator[Backend]:
    from tools.localrun import HandlersBackend
    yield HandlersBackend.start(stack, time_scale=time_scale)


@contextmanager
def ministack_backend(time_scale: float, stack: ExitStack) -> Iterator[Backend]:
    from tools.ministack import MinistackBackend
    yield MinistackBackend.start(stack, time_scale=time_scale)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["ministack", "handlers"], default="ministack")
    parser.add_argument("--jobs", type=int, default=300, help="submissions (face swap makes 2 jobs each)")
    parser.add_argument("--time-scale", type=float, default=0.15,
                        help="multiplies every simulated job duration (1 = Sume-like lengths)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=600, help="seconds before unfinished jobs count as lost")
    args = parser.parse_args(argv)
    console = Console()
    with ExitStack() as stack:
        make = ministack_backend if args.backend == "ministack" else handlers_backend
        try:
            backend = stack.enter_context(make(args.time_scale, stack))
        except KeyboardInterrupt:
            return 130
        try:
            summary = run(backend, args.jobs, args.seed, args.timeout, console)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted; stopping everything the demo started[/yellow]")
            return 130
    console.print(summary_table(summary))
    if not summary.ok:
        console.print(f"[red]FAILED[/red]: lost={summary.lost[:10]} doubled={summary.doubled[:10]}")
        return 1
    console.print("[green]OK[/green]: every job reached exactly one terminal outcome")
    return 0


if __name__ == "__main__":
    sys.exit(main())
