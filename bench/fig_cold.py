"""Figure 4: cold start of the poll function on this host, and the built layer's size.

The layer is what ``sam build`` makes of template.yaml (its makefile installs the wheels of
Lambda's python3.13 arm64 into ``python/``; this host runs the same pure-Python packages on its
own interpreter - wrapt's C extension, needed only with tracing, falls back to pure Python).
The project's ``.aws-sam/build`` is used when it matches the sources, else ``sam build`` runs
(``tools.stack.deployed.build``: cached, into ``.scratch``).

Each sample is a fresh interpreter (``python -I -B``) with Lambda's path: the function's code
dir, then the layer's ``python/`` dir, then the interpreter's site-packages (boto3, as the
Lambda runtime ships it), and the function's environment as the template resolves it (tracing
off: the template's default). It times, from before the first import to after the first
invocation (the interpreter's own start-up is common to both and not counted), in CPU time:

* handler: ``import app`` + ``lambda_handler({"Records": []}, context)`` (the first call builds
  settings and every client: Redis, Sume, DynamoDB, SQS);
* floor: ``import boto3, redis, urllib3`` + ``boto3.client("sqs")`` + ``boto3.client("dynamodb")``.

``-B``: nothing is written next to the sources, like Lambda's read-only ``/opt``; the layer
ships without ``.pyc`` files (they would be this build host's Python version, not 3.13's), so
every cold start compiles it - as in Lambda. A diagnostic runs on a copy compiled ahead of time.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from bench import ROOT, SCRATCH
from bench.report import Row

TARGET = 1.3
PROJECT_BUILD = ROOT / ".aws-sam" / "build"

HANDLER = """
import sys, time
t0 = time.perf_counter(); c0 = time.process_time()
sys.path[:0] = {paths!r}
import app
t1 = time.perf_counter(); c1 = time.process_time()
class Context:
    function_name = "PollFunction"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:PollFunction"
    memory_limit_in_mb = 256
    aws_request_id = "bench-cold-start"
    log_group_name = "/aws/lambda/PollFunction"
    log_stream_name = "bench"
    def get_remaining_time_in_millis(self):
        return 30000
app.lambda_handler({{"Records": []}}, Context())
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


def _sources_match(build: Path) -> bool:
    """Is ``build`` a ``sam build`` of the current sources (layer package, requirements, poll handler)?"""
    layer = build / "SharedLayer" / "python"
    src = ROOT / "layers" / "sume_poller"
    pairs = [(p, layer / "sume_poller" / p.name) for p in (src / "sume_poller").glob("*.py")]
    pairs.append((ROOT / "functions" / "poll" / "app.py", build / "PollFunction" / "app.py"))
    built_pkg = {p.name for p in (layer / "sume_poller").glob("*.py")} if layer.is_dir() else set()
    if built_pkg != {p.name for p in (src / "sume_poller").glob("*.py")}:
        return False
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


def _environment(build: Path) -> tuple[list[str], dict[str, str]]:
    from tools.local_invoke import _python_paths, prepare_environment
    from tools.template import resolve

    spec = resolve({"SumeBaseUrl": "http://127.0.0.1:9/api/v1", "LocalEndpoints": "true",
                    "RedisUrl": "redis://127.0.0.1:9/0"}, build / "template.yaml").functions["PollFunction"]
    env = prepare_environment(spec, base={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/"),
                                          "LANG": "C.UTF-8"})
    env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
                "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
    return _python_paths(spec), env


def _sample(code: str, paths: list[str], env: dict[str, str]) -> dict[str, float]:
    """One fresh interpreter running ``code``."""
    proc = subprocess.run([sys.executable, "-I", "-B", "-c", code.format(paths=paths)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            result: dict[str, float] = json.loads(line.removeprefix("BENCH_RESULT "))
            return result
    raise RuntimeError(f"cold-start child failed ({proc.returncode}): {proc.stderr[-800:]}")


@dataclass
class Timing:
    handler_cpu: float
    handler_wall: float
    import_cpu: float
    floor_cpu: float
    floor_wall: float
    #: handler / floor of each interleaved pair (run back to back: the same neighbours' load).
    pairs: list[float]

    @property
    def ratio(self) -> float:
        """Median of the paired ratios: steadier than a ratio of medians when the load drifts."""
        return median(self.pairs)


def _pair(paths: list[str], env: dict[str, str], runs: int) -> Timing:
    """Medians over ``runs`` interleaved handler / floor samples (after one warm-up of each).

    CPU time of the child (``time.process_time``) is what the ratio uses: on a 2-core machine
    shared with other work, wall time mostly measures the neighbours."""
    _sample(HANDLER, paths, env)  # warm the page cache
    _sample(FLOOR, paths, env)
    handler: list[dict[str, float]] = []
    floor: list[dict[str, float]] = []
    for i in range(runs):
        for code in ((HANDLER, FLOOR) if i % 2 == 0 else (FLOOR, HANDLER)):
            (handler if code is HANDLER else floor).append(_sample(code, paths, env))
    return Timing(median(h["cpu"] for h in handler), median(h["total"] for h in handler),
                  median(h["import_cpu"] for h in handler), median(f["cpu"] for f in floor),
                  median(f["total"] for f in floor), [h["cpu"] / f["cpu"] for h, f in zip(handler, floor, strict=True)])


def _precompiled_copy(layer_python: Path) -> Path:
    """A copy of the layer with .pyc files (unchecked-hash: valid whatever the zip's mtimes)."""
    target = SCRATCH / "bench-sam" / "layer-pyc" / "python"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(layer_python, target)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
                    str(target)], check=True, capture_output=True)
    return target


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(runs: int = 7) -> list[Row]:
    build, where = built()
    paths, env = _environment(build)
    t = _pair(paths, env, runs)
    row = Row("4 cold start: poll handler import + first invocation / floor (fresh interpreter, CPU time)",
              f"{t.handler_cpu * 1000:.0f} ms (import {t.import_cpu * 1000:.0f} ms, first call "
              f"{(t.handler_cpu - t.import_cpu) * 1000:.0f} ms)",
              f"floor: {t.floor_cpu * 1000:.0f} ms (import boto3, redis, urllib3 + sqs and dynamodb clients)",
              t.ratio, f"<= {TARGET}", t.ratio <= TARGET)
    row.notes.append(f"ratio = median of {runs} paired ratios (handler / floor run back to back; range "
                     f"{min(t.pairs):.2f}-{max(t.pairs):.2f}); medians: handler {t.handler_cpu * 1000:.0f} ms, floor "
                     f"{t.floor_cpu * 1000:.0f} ms CPU")
    row.notes.append(f"build {where}; the layer as sam build ships it (no .pyc: compiled on every cold start, as "
                     f"on Lambda's read-only /opt); tracing off; wall time: handler "
                     f"{t.handler_wall * 1000:.0f} ms, floor {t.floor_wall * 1000:.0f} ms")
    layer_python = Path(paths[1])
    pyc_paths = [paths[0], str(_precompiled_copy(layer_python))]
    diag_runs = max(3, runs // 2)
    pyc = _pair(pyc_paths, env, diag_runs)
    row.notes.append(f"diagnostic ({diag_runs} pairs): the layer compiled ahead of time for this host's Python "
                     f"(compileall, unchecked-hash): handler {pyc.handler_cpu * 1000:.0f} ms / floor "
                     f"{pyc.floor_cpu * 1000:.0f} ms, ratio {pyc.ratio:.2f} (handler "
                     f"{t.handler_cpu / pyc.handler_cpu:.1f} x faster than as built)")
    rows = [row]
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
