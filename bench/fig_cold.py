"""Figure 4: every function's cold start on this host against the import floor, and the built layer's size.

The layer is what ``sam build`` makes of template.yaml (its makefile installs the wheels of
Lambda's python3.13 arm64 into ``python/``; this host runs the same pure-Python packages on its
own interpreter - wrapt's C extension, needed only with tracing, falls back to pure Python).
The project's ``.aws-sam/build`` is used when it matches the sources, else ``sam build`` runs
(``tools.stack.deployed.build``: cached, into ``.scratch``).

Each sample is a fresh interpreter (``python -I -B``) with Lambda's path: the function's code
dir, then the layer's ``python/`` dir, then the interpreter's site-packages (boto3, as the
Lambda runtime ships it), and that function's environment as the template resolves it (webhooks
on, so all five functions exist; tracing off: the template's default; Redis on a closed port,
so the cold-start check finds an outage and returns). It times, from before the first import to
after the cold start (the interpreter's own start-up is common to all and not counted), in CPU
time:

* a function: ``import app`` (its handler module, which imports only its own wiring,
  ``sume_poller.wiring.<function>``) + the wiring entry point its handler calls first, which
  builds what the container keeps - settings, the Redis client and its check, the Sume client,
  the boto3 clients it builds up front - and stops before the invocation's own work (``runner()``,
  ``fanout(...)``, ``submitter()``, ``sweeper(...)``, ``receiver()``);
* floor: ``import boto3, redis, urllib3`` + ``boto3.client("sqs")`` + ``boto3.client("dynamodb")``.

One round runs the floor and the five functions, one process each, in an order that rotates
from round to round; a function's ratio is the median over rounds of its time ÷ that round's
floor (side by side: the same neighbours' load).

``-B``: nothing is written next to the sources, like Lambda's read-only ``/opt``. The layer's
makefile compiles bytecode only for a python3.13 found at build time (unchecked-hash); this
host has none, so the layer ships sources alone and every cold start compiles it - as in Lambda
with such a build. A diagnostic runs the poll function on a copy compiled ahead of time for this
host's Python (what a python3.13 build gives Lambda), and another names the poll function's
largest imports beyond the floor (``python -X importtime``).
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from bench import ROOT, SCRATCH
from bench.report import Row, plain, target_line

TARGET = 1.1
PROJECT_BUILD = ROOT / ".aws-sam" / "build"

#: name -> (logical id in template.yaml, the wiring entry point its handler calls first).
FUNCTIONS = {
    "poll": ("PollFunction", "runner()"),
    "fanout": ("FanOutFunction", "checked(parts()[-1])"),  # fanout(...) reads the table's #keys
    "submit": ("SubmitFunction", "submitter()"),
    "sweep": ("SweepFunction", "sweeper(lambda: 30000)"),
    "webhook": ("WebhookFunction", "receiver()"),
}
FLOOR_NAME = "floor"

HANDLER = """
import sys, time
t0 = time.perf_counter(); c0 = time.process_time()
sys.path[:0] = {paths!r}
import app
t1 = time.perf_counter(); c1 = time.process_time()
from sume_poller.wiring import {name} as wiring
eval({entry!r}, vars(wiring))
t2 = time.perf_counter(); c2 = time.process_time()
import json
print("BENCH_RESULT " + json.dumps({{"import_cpu": c1 - c0, "total": t2 - t0, "cpu": c2 - c0}}))
"""

FLOOR = """
import sys, time
t0 = time.perf_counter(); c0 = time.process_time()
sys.path[:0] = {paths!r}
import boto3, redis, urllib3
boto3.client("sqs")
boto3.client("dynamodb")
t2 = time.perf_counter(); c2 = time.process_time()
import json
print("BENCH_RESULT " + json.dumps({{"import_cpu": c2 - c0, "total": t2 - t0, "cpu": c2 - c0}}))
"""

IMPORTTIME = """
import sys
sys.path[:0] = {paths!r}
{imports}
"""


def _sources_match(build: Path) -> bool:
    """Is ``build`` a ``sam build`` of the current sources (the layer package, every handler)?"""
    layer = build / "SharedLayer" / "python" / "sume_poller"
    src = ROOT / "layers" / "sume_poller" / "sume_poller"
    ours = {p.relative_to(src) for p in src.rglob("*.py")}
    if not layer.is_dir() or {p.relative_to(layer) for p in layer.rglob("*.py")} != ours:
        return False
    pairs = [(src / p, layer / p) for p in ours]
    pairs += [(ROOT / "functions" / name / "app.py", build / lid / "app.py") for name, (lid, _) in FUNCTIONS.items()]
    return all(b.is_file() and filecmp.cmp(a, b, shallow=False) for a, b in pairs)


def built() -> tuple[Path, str]:
    """The project's ``.aws-sam/build`` when it matches the sources, else a fresh cached ``sam build``."""
    if _sources_match(PROJECT_BUILD):
        return PROJECT_BUILD, str(PROJECT_BUILD.relative_to(ROOT))
    from tools.stack.deployed import build

    target = build().parent
    if not _sources_match(target):
        raise RuntimeError(f"sam build in {target} does not hold the current sources")
    return target, f"{target.relative_to(ROOT)} (sam build now: .aws-sam/build was stale)"


@dataclass
class Launch:
    """How one kind of sample starts: its code, Python path and environment."""

    name: str
    code: str
    paths: list[str]
    env: dict[str, str]


def _launches(build: Path) -> dict[str, Launch]:
    """The five functions and the floor (on the poll function's path and environment)."""
    from tools.local_invoke import _python_paths, prepare_environment
    from tools.template import resolve

    specs = resolve({"SumeBaseUrl": "http://127.0.0.1:9/api/v1", "LocalEndpoints": "true",
                     "RedisUrl": "redis://127.0.0.1:9/0", "Webhooks": "true"}, build / "template.yaml").functions
    launches: dict[str, Launch] = {}
    for name, (lid, entry) in FUNCTIONS.items():
        spec = specs[lid]
        env = prepare_environment(spec, base={"PATH": os.environ.get("PATH", ""),
                                              "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8"})
        env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_SESSION_TOKEN": "testing", "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
                    "AWS_EC2_METADATA_DISABLED": "true"})
        launches[name] = Launch(name, HANDLER.replace("{name}", name).replace("{entry!r}", repr(entry)),
                                _python_paths(spec), env)
    poll = launches["poll"]
    launches[FLOOR_NAME] = Launch(FLOOR_NAME, FLOOR, poll.paths, poll.env)
    return launches


def _sample(launch: Launch, paths: list[str] | None = None) -> dict[str, float]:
    """One fresh interpreter running ``launch`` (on ``paths`` instead of its own, if given)."""
    code = launch.code.format(paths=paths or launch.paths)
    proc = subprocess.run([sys.executable, "-I", "-B", "-c", code], env=launch.env,
                          capture_output=True, text=True, timeout=120, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            result: dict[str, float] = json.loads(line.removeprefix("BENCH_RESULT "))
            return result
    raise RuntimeError(f"cold-start child {launch.name} failed ({proc.returncode}): {proc.stderr[-800:]}")


@dataclass
class Timing:
    cpu: float
    wall: float
    import_cpu: float
    #: this function's time / the same round's floor, per round.
    ratios: list[float]

    @property
    def ratio(self) -> float:
        """Median of the per-round ratios: steadier than a ratio of medians when the load drifts."""
        return median(self.ratios)


def _rounds(launches: list[Launch], runs: int, paths: dict[str, list[str]] | None = None) -> dict[str, Timing]:
    """``runs`` rounds of every launch (the floor among them), the order rotating each round, after
    one warm-up round (the page cache). CPU time of the child (``time.process_time``) is what the
    ratios use: on a 2-core machine shared with other work, wall time mostly measures the neighbours."""
    paths = paths or {}
    for launch in launches:
        _sample(launch, paths.get(launch.name))
    samples: dict[str, list[dict[str, float]]] = {launch.name: [] for launch in launches}
    for i in range(runs):
        shift = i % len(launches)
        for launch in launches[shift:] + launches[:shift]:
            samples[launch.name].append(_sample(launch, paths.get(launch.name)))
    floor = [s["cpu"] for s in samples[FLOOR_NAME]]
    return {name: Timing(median(s["cpu"] for s in got), median(s["total"] for s in got),
                         median(s["import_cpu"] for s in got), [s["cpu"] / f for s, f in zip(got, floor, strict=True)])
            for name, got in samples.items()}


def _precompiled_copy(layer_python: Path) -> Path:
    """A copy of the layer with .pyc files (unchecked-hash: valid whatever the zip's mtimes)."""
    target = SCRATCH / "bench-sam" / "layer-pyc" / "python"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(layer_python, target)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
                    str(target)], check=True, capture_output=True)
    return target


def _import_self_times(launch: Launch, imports: str) -> dict[str, int]:
    """``python -X importtime``: each module's own import time (µs), in a fresh interpreter."""
    code = IMPORTTIME.format(paths=launch.paths, imports=imports)
    proc = subprocess.run([sys.executable, "-I", "-B", "-X", "importtime", "-c", code], env=launch.env,
                          capture_output=True, text=True, timeout=120, check=False)
    times: dict[str, int] = {}
    for line in proc.stderr.splitlines():
        if m := re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line):
            times[m[2]] = int(m[1])
    return times


def _group(module: str) -> str:
    """Import costs summed by package (the layer's own modules and Powertools' by subpackage)."""
    parts = module.split(".")
    if parts[:2] == ["aws_lambda_powertools", "utilities"]:
        return ".".join(parts[:3])
    return ".".join(parts[:2]) if parts[0] in ("sume_poller", "aws_lambda_powertools") else parts[0]


def beyond_floor(launch: Launch, floor: Launch, runs: int = 3) -> list[tuple[str, float]]:
    """What ``import app`` imports that the floor does not, in ms of own import time by package,
    largest first (median of ``runs`` of each)."""
    handler = [_import_self_times(launch, "import app") for _ in range(runs)]
    base = [_import_self_times(floor, "import boto3, redis, urllib3") for _ in range(runs)]
    known = set().union(*base)
    totals: dict[str, float] = defaultdict(float)
    for module in set().union(*handler) - known:
        totals[_group(module)] += median(h.get(module, 0) for h in handler) / 1000
    return sorted(totals.items(), key=lambda item: -item[1])


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(runs: int = 7) -> list[Row]:
    build, where = built()
    launches = _launches(build)
    order = [launches[FLOOR_NAME], *(launches[name] for name in FUNCTIONS)]
    t = _rounds(order, runs)
    floor = t[FLOOR_NAME]
    rows: list[Row] = []
    for name in FUNCTIONS:
        f = t[name]
        spread = f"range {min(f.ratios):.2f}-{max(f.ratios):.2f}"
        figure = (f"4 cold start: {name} handler import + container parts / floor (fresh interpreter, CPU time)"
                  if name == "poll" else f"4 cold start: {name}, measured as poll")
        measured = (f"{f.cpu * 1000:.0f} ms (import {f.import_cpu * 1000:.0f} ms, parts "
                    f"{(f.cpu - f.import_cpu) * 1000:.0f} ms; {spread})")
        baseline = f"floor: {floor.cpu * 1000:.0f} ms (import boto3, redis, urllib3 + sqs and dynamodb clients)"
        if name == "poll":
            row = Row(figure, measured, baseline, f.ratio, f"<= {TARGET}", f.ratio <= TARGET,
                      lines=[target_line("coldstart", name, f.ratio, "<=", TARGET)])
        else:
            row = Row(figure, measured, baseline, f.ratio, "-", None, lines=[f"coldstart {name}: {plain(f.ratio)}"])
        rows.append(row)
    poll = rows[0]
    poll.notes.append(f"each ratio = median of {runs} per-round ratios (a round: the floor and the five functions, "
                      f"one fresh interpreter each, the order rotating); medians: floor {floor.cpu * 1000:.0f} ms "
                      "CPU, " + ", ".join(f"{n} {t[n].cpu * 1000:.0f} ms" for n in FUNCTIONS))
    layer_python = Path(launches["poll"].paths[1])
    shipped = ("with python3.13's .pyc files, which this host's Python cannot load: it compiles the sources"
               if any(layer_python.rglob("*.pyc")) else "without .pyc (no python3.13 at build time): compiled on "
               "every cold start, as on Lambda's read-only /opt")
    poll.notes.append(f"build {where}; the layer as sam build ships it, {shipped}; tracing off; Redis refused "
                      f"(the check returns); wall time: floor {floor.wall * 1000:.0f} ms, "
                      + ", ".join(f"{n} {t[n].wall * 1000:.0f} ms" for n in FUNCTIONS))
    extra = beyond_floor(launches["poll"], launches[FLOOR_NAME])
    poll.notes.append(f"poll's imports beyond the floor (-X importtime, own time, median of 3): "
                      f"{sum(ms for _, ms in extra):.0f} ms - "
                      + ", ".join(f"{name} {ms:.0f}" for name, ms in extra[:8]))
    compiled = [launches["poll"].paths[0], str(_precompiled_copy(layer_python))]
    diag_runs = max(3, runs // 2)
    pyc = _rounds([launches[FLOOR_NAME], launches["poll"]], diag_runs, {"poll": compiled, FLOOR_NAME: compiled})
    poll.notes.append(f"diagnostic ({diag_runs} rounds): the layer compiled ahead of time for this host's Python "
                      f"(compileall, unchecked-hash, as the makefile does for python3.13): poll "
                      f"{pyc['poll'].cpu * 1000:.0f} ms / floor {pyc[FLOOR_NAME].cpu * 1000:.0f} ms, ratio "
                      f"{pyc['poll'].ratio:.2f} (poll {t['poll'].cpu / pyc['poll'].cpu:.1f} x faster than as built)")
    du = subprocess.run(["du", "-sk", str(build / "SharedLayer")], capture_output=True, text=True, check=True)
    kib = int(du.stdout.split()[0])
    zipped = shutil.make_archive(str(SCRATCH / "bench-sam" / "layer"), "zip", build / "SharedLayer")
    zip_bytes = Path(zipped).stat().st_size
    Path(zipped).unlink()
    parts = sorted(((_size(p), p.name) for p in layer_python.iterdir() if p.is_dir() and
                    not p.name.endswith(".dist-info")), reverse=True)
    size = Row("4 built layer size (du of SharedLayer after sam build)", f"{kib / 1024:.1f} MiB on disk, "
               f"{zip_bytes / 1024 / 1024:.1f} MiB zipped",
               "Lambda limits: 250 MiB unzipped (function + layers), 50 MiB zipped upload",
               kib / 1024 / 250, "report (ratio = share of the 250 MiB limit)", None)
    size.notes.append("largest parts: " + ", ".join(f"{name} {b / 1024 / 1024:.1f} MiB" for b, name in parts[:4]))
    rows.append(size)
    return rows
