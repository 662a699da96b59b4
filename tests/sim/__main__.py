"""``python -m tests.sim``: run schedules, print one line, replay a failing seed.

    python -m tests.sim --schedules 1000            seeds 1..1000 (``--first`` moves the start)
    python -m tests.sim --seed 1234 --replay        one seed: its plan, every step, each violation's story
    python -m tests.sim --schedules 100000 --workers 2

The last line is always ``simulation: <schedules> schedules, <steps> steps, <violations> violations
(seed <first>..<last>)``; the exit status is 1 when there was any violation. A run replays exactly
only under the same hash seed: the command sets ``PYTHONHASHSEED=0`` and restarts itself when the
environment did not.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor


def _pin_hash_seed() -> None:
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tests.sim", *sys.argv[1:]])


#: A run that takes longer than this (real seconds) is stuck: its stacks are printed and the process ends.
STUCK_AFTER = 600


START = 1_780_272_000.0  # tests.sim.world.START (not imported here: the command re-executes itself first)


def _batch(seeds: list[int]) -> list[tuple[int, int, str, list[str], str, float, dict[str, int]]]:
    from .run import run

    out = []
    for seed in seeds:
        faulthandler.dump_traceback_later(STUCK_AFTER, exit=True)
        result = run(seed)
        faulthandler.cancel_dump_traceback_later()
        out.append((seed, result.steps, result.ended,
                    [f"{v.invariant} {v.job or ''} at {v.at - START:.0f}s: {v.detail}" for v in result.violations],
                    result.trace, result.cpu, result.faults))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--first", type=int, default=1, help="the first seed")
    parser.add_argument("--seed", type=int, help="one seed (same as --first SEED --schedules 1)")
    parser.add_argument("--replay", action="store_true", help="print the seed's plan, steps and violations")
    parser.add_argument("--workers", type=int, default=1, help="processes (seeds are split between them)")
    parser.add_argument("--quiet", action="store_true", help="only the summary line and failing seeds")
    args = parser.parse_args(argv)
    _pin_hash_seed()
    if args.seed is not None:
        args.first, args.schedules = args.seed, 1
    seeds = list(range(args.first, args.first + args.schedules))
    if args.replay:
        return _replay(seeds[0])
    started = time.process_time()
    wall = time.monotonic()
    if args.workers > 1:
        chunks = [seeds[i::args.workers] for i in range(args.workers)]
        with ProcessPoolExecutor(args.workers) as pool:
            results = sorted(r for chunk in pool.map(_batch, chunks) for r in chunk)
    else:
        results = _batch(seeds)
    steps = sum(r[1] for r in results)
    violations = sum(len(r[3]) for r in results)
    failing = [r for r in results if r[3]]
    ends = Counter(r[2] for r in results)
    for seed, _, _, found, _, _, _ in failing[:50]:
        print(f"seed {seed}: {len(found)} violation(s); replay: make simulation SEED={seed}")
        for line in found[:3]:
            print(f"    {line[:300]}")
    if len(failing) > 50:
        print(f"... and {len(failing) - 50} more failing seeds")
    kinds = Counter(line.split()[0] for r in failing for line in r[3])
    if not args.quiet:
        print(f"runs ended: {dict(ends)}; violations by invariant: {dict(kinds)}; "
              f"CPU {time.process_time() - started:.1f} s in this process, wall {time.monotonic() - wall:.1f} s")
    print(f"simulation: {len(results)} schedules, {steps} steps, {violations} violations "
          f"(seed {seeds[0]}..{seeds[-1]})")
    return 1 if violations else 0


def _replay(seed: int) -> int:
    from .run import run

    result = run(seed)
    print(f"seed {seed}: {result.plan.describe()}")
    print(f"ended {result.ended} after {result.steps} steps, {result.clock:.0f} clock seconds; faults {result.faults}; "
          f"trace {result.trace[:16]}")
    for at, what, _ in result.recent:
        print(f"  {at - START:9.3f}  {what}")
    for violation in result.violations:
        print(f"\nVIOLATION {violation.invariant} ({violation.job}) at {violation.at - START:.1f}s: "
              f"{violation.detail}")
        for at, who, what in result.history.get(violation.job or "", [])[-60:]:
            print(f"  {at - START:9.3f}  {who:<22} {what}")
    print(f"simulation: 1 schedules, {result.steps} steps, {len(result.violations)} violations (seed {seed}..{seed})")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
