"""The layer as ``sam build`` ships it (the build this tier deploys) carries Python 3.13 bytecode for every
module, and Python 3.13 loads the layer from it without compiling anything: Lambda's ``/opt`` is read-only,
so a module without its ``.pyc`` is compiled on every cold start (tools/bytecode.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tools.bytecode import PYTHON313, problems
from tools.stack.deployed import build

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def layer() -> Path:
    """The ``python/`` dir of the SharedLayer that ``sam build`` made for this tier."""
    return build().parent / "SharedLayer" / "python"


def test_the_built_layer_ships_python313_bytecode_that_it_loads(layer: Path) -> None:
    assert sorted(layer.glob("sume_poller/**/*.py"))  # the build holds the package at all
    assert problems(layer) == []


def test_the_check_names_missing_stale_and_checked_bytecode(layer: Path, tmp_path: Path) -> None:
    copy = tmp_path / "python"
    shutil.copytree(layer, copy)
    package = copy / "sume_poller" / "core"
    (package / "__pycache__" / "clock.cpython-313.pyc").unlink()
    jobs = package / "jobs.py"
    jobs.write_text(jobs.read_text() + "\n# edited after the build\n")
    subprocess.run([str(PYTHON313), "-m", "compileall", "-q", "--invalidation-mode", "timestamp",
                    str(package / "aws.py")], check=True)

    assert sorted(problems(copy)) == [
        "sume_poller/core/aws.py: aws.cpython-313.pyc is not unchecked-hash",
        "sume_poller/core/clock.py: compiled from source at import",
        "sume_poller/core/clock.py: no clock.cpython-313.pyc",
        "sume_poller/core/jobs.py: jobs.cpython-313.pyc is stale (not its source's hash)",
    ]
