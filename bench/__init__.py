"""Benchmarks of sume-poller: ``python -m bench`` (or ``make bench``).

Every figure is a ratio measured side by side against its baseline in the same run, because
absolute times on a small shared machine are noise. See ``python -m bench --help`` and
``docs/benchmarks.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / ".scratch"
LAYER_SRC = ROOT / "layers" / "sume_poller"

# What /opt/python is in Lambda (pytest does the same through pyproject's pythonpath).
for _path in (str(LAYER_SRC), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)
