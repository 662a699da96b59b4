"""Figure 6 (optional): end to end through template.yaml deployed into ministack.

Needs ``tools.ministack.MinistackBackend`` - the demo's backend protocol (``start(stack,
time_scale=..., log=...)``, ``submit``, ``tick``, ``records``, ``sim_stats``). When it is not
importable or lacks one of those, the row says "n/a" and nothing else changes: wiring another
deployment later means giving :func:`measure` a backend with that protocol.

Jobs are submitted through the deployed submit function; the deployed SQS event source and poll
function do the rest. Measured: jobs per second from the first submit to the last terminal
record, and Sume status reads per job / the simulator's minimum (the figure 1 measure).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from bench import SCRATCH
from bench.fig_reads import TARGET, plan
from bench.report import Row, unavailable

TITLE = "6 End to end, template deployed into ministack: reads / min"
NEEDED = ("start", "submit", "tick", "records", "sim_stats")


def backend_class() -> tuple[Any, str | None]:
    """(MinistackBackend, None), or (None, why it cannot be used)."""
    try:
        from tools import ministack
    except Exception as exc:  # any import failure means "not available"
        return None, f"ministack backend not available: {type(exc).__name__}: {exc}"[:120]
    backend = getattr(ministack, "MinistackBackend", None)
    missing = [name for name in NEEDED if not hasattr(backend, name)]
    if backend is None or missing:
        return None, f"ministack backend not available (missing {', '.join(missing) or 'MinistackBackend'})"
    return backend, None


def measure(n: int, seed: int, timeout: float, time_scale: float = 1.0,
            start: Callable[[ExitStack, Any], Any] | None = None) -> Row:
    backend_type, why = backend_class()
    if backend_type is None and start is None:
        return unavailable(TITLE, f"<= {TARGET}", why or "ministack backend not available")
    log_path = SCRATCH / "bench-ministack.log"
    with ExitStack() as stack, open(log_path, "a") as log:
        def say(text: str) -> None:
            log.write(text + "\n")
            log.flush()

        started_setup = time.monotonic()
        make = start or (lambda st, log: backend_type.start(st, time_scale=time_scale, log=log))
        backend = make(stack, say)
        setup = time.monotonic() - started_setup
        run = uuid.uuid4().hex[:8]
        ids: list[str] = []
        started = time.monotonic()
        for i, (kind, spec) in enumerate(plan(n, seed)):
            reply = backend.submit({"kind": kind, "params": {"prompt": f"bench {run} #{i}", "sim": spec},
                                    "idempotency_key": f"bench-{run}-{i:04d}"})
            ids.extend(reply.get("job_ids", []))
        submitted = time.monotonic() - started
        deadline = time.monotonic() + timeout
        wanted = set(ids)
        done = 0
        while True:
            backend.tick()
            records = [r for r in backend.records() if r.get("job_id") in wanted]
            done = sum(1 for r in records if r.get("status") not in (None, "pending"))
            if done == len(ids) or time.monotonic() > deadline:
                break
        wall = time.monotonic() - started
        jobs = backend.sim_stats().get("jobs", {})
    reads = sum(jobs[j]["status_reads"] for j in ids if j in jobs)
    minimum = sum(jobs[j]["min_reads"] or 0 for j in ids if j in jobs)
    ratio = reads / minimum if minimum else None
    finished = done == len(ids)
    row = Row(TITLE, f"{ratio or float('nan'):.3f} ({reads} reads / {minimum} min); {done / wall:.1f} jobs/s "
              f"({done}/{len(ids)} jobs in {wall:.0f} s)", "schedule minimum (simulator)", ratio,
              f"<= {TARGET}", finished and ratio is not None and ratio <= TARGET)
    row.notes.append(f"{n} submissions ({len(ids)} jobs, 2-8 s long in Sume) through the deployed submit function in "
                     f"{submitted:.0f} s; jobs/s is bounded by the jobs' own length and the first poll's delay, not a "
                     f"capacity figure (raise --e2e-jobs for that); "
                     f"start-up (build, deploy) {setup:.0f} s, log in {log_path.relative_to(SCRATCH.parent)}"
                     + ("" if finished else f"; NOT FINISHED: {len(ids) - done} jobs pending at the deadline"))
    return row
