"""The built layer's bytecode, checked as Lambda's python3.13 runtime loads it from its read-only ``/opt``.

Python 3.13 looks for ``__pycache__/<name>.cpython-313.pyc`` beside each ``<name>.py``; where there is none
(or one it cannot use) it compiles the source, and on a read-only ``/opt`` it does so on every cold start.
The layer's build writes the files unchecked-hash (layers/sume_poller/Makefile): valid whatever times the
zip gives the sources, and never compared with them when loaded - so a stale one would run old code.

:func:`problems` runs a fresh Python 3.13 (``.venv-313``, the runtime's: ``make setup``) that reads every
``.py`` under the layer's ``python/`` dir and names each whose ``.pyc`` is missing, not Python 3.13's, not
unchecked-hash, or not its source's (the hash in its header against the source's); then, with nothing
written (``-B``), it imports every module of ``sume_poller`` from the layer and names each that Python
compiled from source instead of loading its bytecode. An empty list: the layer loads as shipped.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON313 = ROOT / ".venv-313" / "bin" / "python"

#: Runs on Python 3.13: argv[1] is the layer's python/ dir; prints the problems as a JSON list.
_CHECK = r"""
import importlib, importlib.util, json, pkgutil, sys
from importlib import _bootstrap_external
from pathlib import Path

root = Path(sys.argv[1]).resolve()
problems = []
for py in sorted(root.rglob("*.py")):
    name = str(py.relative_to(root))
    pyc = py.parent / "__pycache__" / f"{py.stem}.{sys.implementation.cache_tag}.pyc"
    if not pyc.is_file():
        problems.append(f"{name}: no {pyc.name}")
        continue
    head = pyc.read_bytes()[:16]
    if head[:4] != importlib.util.MAGIC_NUMBER:
        problems.append(f"{name}: {pyc.name} is not Python {sys.version_info[0]}.{sys.version_info[1]}'s")
    elif int.from_bytes(head[4:8], "little") != 0b01:  # hash-based, not checked against the source
        problems.append(f"{name}: {pyc.name} is not unchecked-hash")
    elif head[8:16] != importlib.util.source_hash(py.read_bytes()):
        problems.append(f"{name}: {pyc.name} is stale (not its source's hash)")

compiled = []
to_code = _bootstrap_external.SourceLoader.source_to_code
def recorded(self, data, path, *, _optimize=-1):
    compiled.append(path)
    return to_code(self, data, path, _optimize=_optimize)
_bootstrap_external.SourceLoader.source_to_code = recorded
sys.path.insert(0, str(root))
import sume_poller
for module in pkgutil.walk_packages(sume_poller.__path__, "sume_poller."):
    importlib.import_module(module.name)
problems += [f"{Path(p).relative_to(root)}: compiled from source at import" for p in compiled
             if Path(p).resolve().is_relative_to(root)]
print(json.dumps(problems))
"""


def problems(layer_python: Path, python: Path = PYTHON313) -> list[str]:
    """What keeps Python 3.13 from loading the layer at ``layer_python`` from its bytecode (empty: nothing)."""
    if not python.exists():
        raise FileNotFoundError(f"{python} missing: run make setup (Python 3.13 with the runtime's boto3)")
    done = subprocess.run([str(python), "-I", "-B", "-c", _CHECK, str(layer_python)], capture_output=True,
                          text=True, timeout=120, check=False, env={"AWS_DEFAULT_REGION": "us-east-1"})
    if done.returncode != 0:
        raise RuntimeError(f"the bytecode check failed on {layer_python}:\n{done.stderr[-2000:]}")
    found: list[str] = json.loads(done.stdout)
    return found
