"""Figure 4: every function's cold start as Lambda's python3.13 runtime runs it, against the import
floor on the same interpreter, and the built layer's size.

The layer is what ``sam build`` makes of template.yaml: the wheels of Lambda's python3.13 arm64 in
``python/`` (this host runs the same pure-Python packages - wrapt's C extension, needed only with
tracing, falls back to pure Python) and every module's bytecode, compiled by the build's Python 3.13
(layers/sume_poller/Makefile; unchecked-hash, so valid whatever the zip's times). The project's
``.aws-sam/build`` is used when it holds the current sources and their bytecode, else ``sam build``
runs (``tools.stack.deployed.build``: cached, into ``.scratch``).

Each sample is a fresh Python 3.13 (``.venv-313``: boto3 and botocore as the python3.13 runtime ships
them, compiled at install like the runtime's own - scripts/requirements-313.txt) run ``-I -B`` with
Lambda's path: the function's code dir, then the layer's ``python/`` dir, then the interpreter's
site-packages (boto3); nothing is written next to the sources, as on Lambda's read-only ``/opt``.
The environment is that function's as the template resolves it (webhooks on, so all six functions
exist; tracing off: the template's default; Redis on a closed port, so the cold-start check finds an
outage and returns). It times, from before the first import to after the cold start (the
interpreter's own start-up is common to all and not counted), in CPU time:

* a function: ``import app`` (its handler module, which imports only its own wiring,
  ``sume_poller.wiring.<function>``) + the wiring entry point its handler calls first, which
  builds what the container keeps - settings, the Redis client and its check, the Sume client,
  the boto3 clients it builds up front - and stops before the invocation's own work (``runner()``,
  ``fanout(...)``, ``submitter()``, ``sweeper(...)``, ``receiver()``, ``api()``);
* floor: ``import boto3, redis, urllib3`` + ``boto3.client("sqs")`` + ``boto3.client("dynamodb")``.

One round runs the floor and the six functions, one process each, in an order that rotates from
round to round; a function's ratio is the median over rounds of its time / that round's floor (side
by side: the same neighbours' load). Two diagnostics follow on the same interpreter: the rounds again
on a copy of the layer without its ``.pyc`` files (what a build without Python 3.13 ships: every cold
start compiles the layer), and each function's largest imports beyond the floor (``python -X
importtime``, own time).
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from bench import ROOT, SCRATCH
from bench.report import Row, target_line

TARGET = 1.15
PROJECT_BUILD = ROOT / ".aws-sam" / "build"
#: Lambda's interpreter: Python 3.13 with the runtime's boto3 (the Makefile builds it).
PYTHON313 = ROOT / ".venv-313" / "bin" / "python"
#: The bytecode file name Python 3.13 looks for beside ``name.py`` (``__pycache__/name.<TAG>.pyc``).
TAG = "cpython-313"

#: name -> (logical id in template.yaml, the wiring entry point its handler calls first).
FUNCTIONS = {
    "poll": ("PollFunction", "runner()"),
    "fanout": ("FanOutFunction", "checked(parts()[-1])"),  # fanout(...) reads the table's #keys
    "submit": ("SubmitFunction", "submitter()"),
    "sweep": ("SweepFunction", "sweeper(lambda: 30000)"),
    "webhook": ("WebhookFunction", "receiver()"),
    "jobs": ("JobsFunction", "api()"),
}
FLOOR_NAME = "floor"
FLOOR_IMPORTS = "import boto3, redis, urllib3"

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


def missing_bytecode(python_dir: Path) -> list[Path]:
    """The ``.py`` files under ``python_dir`` without Python 3.13's ``.pyc`` beside them (the quick look;
    ``tools.bytecode`` checks that those there are the sources' and load)."""
    return [py for py in python_dir.rglob("*.py") if not (py.parent / "__pycache__" / f"{py.stem}.{TAG}.pyc").is_file()]


def _sources_match(build: Path) -> bool:
    """Is ``build`` a ``sam build`` of the current sources (the layer package, every handler), with bytecode?"""
    layer = build / "SharedLayer" / "python" / "sume_poller"
    src = ROOT / "layers" / "sume_poller" / "sume_poller"
    ours = {p.relative_to(src) for p in src.rglob("*.py")}
    if not layer.is_dir() or {p.relative_to(layer) for p in layer.rglob("*.py")} != ours:
        return False
    if missing_bytecode(layer.parent):  # built before the layer's build compiled it
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
        raise RuntimeError(f"sam build in {target} does not hold the current sources and their Python 3.13 bytecode")
    return target, f"{target.relative_to(ROOT)} (sam build now: .aws-sam/build was stale)"


def shipped(build: Path) -> Path:
    """The built layer's ``python/`` dir, once tools.bytecode found that Python 3.13 loads it from its bytecode."""
    from tools.bytecode import problems

    layer = build / "SharedLayer" / "python"
    if found := problems(layer, PYTHON313):
        raise RuntimeError(f"the built layer does not load from its bytecode: {'; '.join(found[:5])}")
    return layer


@dataclass
class Launch:
    """How one kind of sample starts: its code, Python path and environment."""

    name: str
    code: str
    paths: list[str]
    env: dict[str, str]


def _launches(build: Path) -> dict[str, Launch]:
    """The six functions and the floor (on the poll function's path and environment)."""
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


def _python() -> str:
    if not PYTHON313.exists():
        raise RuntimeError(f"{PYTHON313.relative_to(ROOT)} missing: run make setup")
    return str(PYTHON313)


def _with_layer(paths: list[str], layer: Path | None) -> list[str]:
    """A launch's path with ``layer`` in place of the built layer's ``python/`` dir (the second entry)."""
    return paths if layer is None else [paths[0], str(layer), *paths[2:]]


def _sample(launch: Launch, layer: Path | None = None) -> dict[str, float]:
    """One fresh Python 3.13 running ``launch`` (on ``layer`` instead of the built layer, if given)."""
    code = launch.code.format(paths=_with_layer(launch.paths, layer))
    proc = subprocess.run([_python(), "-I", "-B", "-c", code], env=launch.env,
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


def _rounds(launches: list[Launch], runs: int, layer: Path | None = None) -> dict[str, Timing]:
    """``runs`` rounds of every launch (the floor among them), the order rotating each round, after
    one warm-up round (the page cache). CPU time of the child (``time.process_time``) is what the
    ratios use: on a 2-core machine shared with other work, wall time mostly measures the neighbours."""
    for launch in launches:
        _sample(launch, layer)
    samples: dict[str, list[dict[str, float]]] = {launch.name: [] for launch in launches}
    for i in range(runs):
        shift = i % len(launches)
        for launch in launches[shift:] + launches[:shift]:
            samples[launch.name].append(_sample(launch, layer))
    floor = [s["cpu"] for s in samples[FLOOR_NAME]]
    return {name: Timing(median(s["cpu"] for s in got), median(s["total"] for s in got),
                         median(s["import_cpu"] for s in got), [s["cpu"] / f for s, f in zip(got, floor, strict=True)])
            for name, got in samples.items()}


def _sources_only(layer_python: Path) -> Path:
    """A copy of the layer without its ``.pyc`` files: what a build without Python 3.13 ships."""
    target = SCRATCH / "bench-sam" / "layer-sources" / "python"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(layer_python, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _import_self_times(launch: Launch, imports: str) -> dict[str, int]:
    """``python -X importtime``: each module's own import time (µs), in a fresh Python 3.13."""
    code = IMPORTTIME.format(paths=launch.paths, imports=imports)
    proc = subprocess.run([_python(), "-I", "-B", "-X", "importtime", "-c", code], env=launch.env,
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


def beyond_floor(launch: Launch, base: list[dict[str, int]], runs: int = 3) -> list[tuple[str, float]]:
    """What ``import app`` imports that the floor (``base``: its import times, one per run) does not, in ms of
    own import time by package, largest first (median of ``runs``)."""
    handler = [_import_self_times(launch, "import app") for _ in range(runs)]
    known = set().union(*base)
    totals: dict[str, float] = defaultdict(float)
    for module in set().union(*handler) - known:
        totals[_group(module)] += median(h.get(module, 0) for h in handler) / 1000
    return sorted(totals.items(), key=lambda item: -item[1])


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def measure(runs: int = 7) -> list[Row]:
    build, where = built()
    layer_python = shipped(build)
    launches = _launches(build)
    order = [launches[FLOOR_NAME], *(launches[name] for name in FUNCTIONS)]
    t = _rounds(order, runs)
    floor = t[FLOOR_NAME]
    rows: list[Row] = []
    for name in FUNCTIONS:
        f = t[name]
        figure = f"4 cold start: {name} handler import + container parts / floor (Python 3.13, shipped bytecode, CPU)"
        measured = (f"{_ms(f.cpu)} (import {_ms(f.import_cpu)}, parts {_ms(f.cpu - f.import_cpu)}; "
                    f"range {min(f.ratios):.2f}-{max(f.ratios):.2f})")
        baseline = f"floor: {_ms(floor.cpu)} ({FLOOR_IMPORTS} + sqs and dynamodb clients)"
        rows.append(Row(figure, measured, baseline, f.ratio, f"<= {TARGET}", f.ratio <= TARGET,
                        lines=[target_line("coldstart", name, f.ratio, "<=", TARGET)]))
    first = rows[0]
    first.notes.append(f"each ratio = median of {runs} per-round ratios (a round: the floor and the six functions, "
                       f"one fresh Python 3.13 each, the order rotating); medians: floor {_ms(floor.cpu)} CPU, "
                       + ", ".join(f"{n} {_ms(t[n].cpu)}" for n in FUNCTIONS))
    versions = subprocess.run([_python(), "-I", "-c", "import boto3, botocore, sys; print(sys.version.split()[0], "
                               "boto3.__version__, botocore.__version__)"], capture_output=True, text=True,
                              check=True).stdout.split()
    first.notes.append(f"build {where}: the layer as sam build ships it, Python 3.13 bytecode for all "
                       f"{sum(1 for _ in layer_python.rglob('*.py'))} modules; Python {versions[0]}, boto3 "
                       f"{versions[1]}, botocore {versions[2]}; tracing off; Redis refused (the check returns); "
                       f"wall time: floor {_ms(floor.wall)}, " + ", ".join(f"{n} {_ms(t[n].wall)}" for n in FUNCTIONS))
    diag_runs = max(3, runs // 2)
    src = _rounds(order, diag_runs, _sources_only(layer_python))
    first.notes.append(f"diagnostic ({diag_runs} rounds): the same layer without its .pyc files (a build without "
                       f"Python 3.13: the layer compiled on every cold start): floor {_ms(src[FLOOR_NAME].cpu)}, "
                       + ", ".join(f"{n} {_ms(src[n].cpu)} ratio {src[n].ratio:.2f}" for n in FUNCTIONS)
                       + f"; the bytecode makes poll {src['poll'].cpu / t['poll'].cpu:.1f}x faster to start")
    base = [_import_self_times(launches[FLOOR_NAME], FLOOR_IMPORTS) for _ in range(3)]
    for row, name in zip(rows, FUNCTIONS, strict=True):
        extra = beyond_floor(launches[name], base)
        row.notes.append(f"{name}'s imports beyond the floor (-X importtime, own time, median of 3): "
                         f"{sum(ms for _, ms in extra):.0f} ms - " + ", ".join(f"{m} {ms:.0f}" for m, ms in extra[:6]))
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
