"""Figure 6: end to end, template.yaml built and deployed into ministack: reads / minimum.

:class:`tools.stack.deployed.DeployedStack` runs ``sam build`` + ``sam deploy`` of the template
into ministack (Lambdas as local processes, the SQS event source mapping, the schedules), with a
real redis-server and the Sume simulator (hints on). Jobs of figure 1's plan are submitted
through the deployed submit function; the deployed queue, event source and poll function do the
rest. Measured: Sume status reads per job / the simulator's minimum (figure 1's measure), and
jobs per second from the first submit to the last terminal record (bounded by the jobs' own
length and the first poll's delay: not a capacity figure). The read budget is far from binding.
"""

from __future__ import annotations

import time
import uuid

from bench import SCRATCH, fig_reads
from bench.report import Row, unavailable

TITLE = "6 end to end, template deployed into ministack: reads / minimum"
TARGET = fig_reads.TARGET  # figure 1's measure, deployed
PARAMETERS = {"ReadsPerMinute": 100_000, "ReadsPerDay": 0, "CreatesPerMinute": 0, "CreatesPerDay": 0}


def measure(n: int, seed: int, timeout: float) -> list[Row]:
    """The figure's row; "n/a" when ministack or sam is not installed (``make setup`` installs them)."""
    from tools.stack import SetupError

    try:
        return [_measure(n, seed, timeout)]
    except SetupError as exc:
        return [unavailable(TITLE, f"<= {TARGET}", str(exc))]


def _measure(n: int, seed: int, timeout: float) -> Row:
    from tools.stack.deployed import DeployedStack

    log_path = SCRATCH / "bench-ministack.log"
    with open(log_path, "a") as log:
        def say(text: str) -> None:
            log.write(text + "\n")
            log.flush()

        started_setup = time.monotonic()
        with DeployedStack(time_scale=1.0, parameters=PARAMETERS, stack_name="sume-poller-bench", log=say) as stack:
            setup = time.monotonic() - started_setup
            run = uuid.uuid4().hex[:8]
            ids: list[str] = []
            started = time.monotonic()
            for i, (kind, spec) in enumerate(fig_reads.plan(n, seed)):
                reply = stack.submit({"kind": kind, "params": {"prompt": f"bench {run} #{i}", "sim": spec}})
                ids.extend(reply.get("job_ids", []))
            submitted = time.monotonic() - started
            finished = True
            try:
                stack.drive(lambda: stack.settled(ids), timeout)
            except TimeoutError as exc:
                finished = False
                say(f"figure 6 not finished: {exc}")
            wall = time.monotonic() - started
            jobs = stack.sim.stats()["jobs"]
            done = sum(1 for r in stack.records(ids) if r.get("status") != "pending")
    reads = sum(jobs[j]["status_reads"] for j in ids)
    minimum = sum(jobs[j]["min_reads"] or 0 for j in ids)
    ratio = reads / minimum if minimum else float("nan")
    row = Row(TITLE, f"{ratio:.3f} ({reads} reads / {minimum} min); {done / wall:.1f} jobs/s ({done}/{len(ids)} jobs "
              f"in {wall:.0f} s)", "the simulator's minimum", ratio, f"<= {TARGET}", finished and ratio <= TARGET)
    row.notes.append(f"{n} submissions ({len(ids)} jobs, 2-8 s long in Sume) through the deployed submit function in "
                     f"{submitted:.0f} s; build + deploy {setup:.0f} s; log {log_path.relative_to(SCRATCH.parent)}"
                     + ("" if finished else f"; NOT FINISHED: {len(ids) - done} jobs pending at the deadline"))
    return row
