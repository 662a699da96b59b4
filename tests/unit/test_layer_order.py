"""The layer's packages keep one order, lowest first: a module imports only from its own package or
a lower one - at the top of the file or inside a function alike (a function-level import is for a
cold start, never a way around the order) - and no modules import each other in a circle. Package
``__init__`` files load nothing eagerly: a function loads only the modules it runs."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

LAYER = Path(__file__).resolve().parents[2] / "layers" / "sume_poller" / "sume_poller"
#: Lowest first. ``runtime`` (the entry points for local tools) is a module atop everything.
ORDER = ("core", "config", "schedule", "limits", "sume", "store", "api", "discovery", "creates", "poll", "wiring",
         "runtime")


def _name(path: Path) -> str:
    parts = ["sume_poller", *path.relative_to(LAYER).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(module: str) -> bool:
    path = LAYER.joinpath(*module.split(".")[1:])
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imports(path: Path, source: str | None = None) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every sume_poller import of one file."""
    tree = ast.parse(path.read_text() if source is None else source)
    package = _name(path) if path.name == "__init__.py" else _name(path).rpartition(".")[0]
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            # ``from . import once`` imports a module; ``from .. import lazy_exports`` a package's name
            targets = [module] if node.module else [f"{module}.{a.name}" if _exists(f"{module}.{a.name}") else module
                                                    for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            if target == "sume_poller" or target.startswith("sume_poller."):
                yield target, node.lineno, id(node) in top


def _rank(module: str) -> int:
    parts = module.split(".")
    return -1 if len(parts) == 1 else ORDER.index(parts[1])


MODULES = sorted(LAYER.rglob("*.py"))


def test_every_module_lives_in_a_package_of_the_order() -> None:
    loose = [_name(p) for p in MODULES if _name(p) != "sume_poller" and _name(p).split(".")[1] not in ORDER]
    assert not loose, f"modules outside the packages {ORDER}: {loose}"
    assert {p.name for p in LAYER.iterdir() if p.suffix == ".py"} == {"__init__.py", "runtime.py"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _name(p))
def test_a_module_imports_nothing_above_its_package(path: Path) -> None:
    me = _name(path)
    upward = [f"line {line}: {target}" for target, line, _ in _imports(path) if _rank(target) > _rank(me)]
    assert not upward, f"{me} imports from above its package: {upward}"


def test_no_modules_import_each_other_in_a_circle() -> None:
    graph = {_name(p): {t for t, _, top in _imports(p) if top and t != _name(p)} for p in MODULES}
    # A name imported from a package (``from .. import lazy_exports``) is that package's __init__.
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            nxt = nxt if nxt in graph else nxt.rpartition(".")[0]
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join([*trail[trail.index(nxt):], nxt]))
            if nxt in graph and not state.get(nxt):
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for module in sorted(graph):
        if not state.get(module):
            visit(module, [module])


@pytest.mark.parametrize("package", ORDER[:-2])
def test_a_package_init_loads_no_module_until_one_of_its_names_is_used(package: str) -> None:
    path = LAYER / package / "__init__.py"
    assert [target for target, _, _ in _imports(path)] == ["sume_poller"]  # lazy_exports, nothing else
    module = importlib.import_module(f"sume_poller.{package}")
    for name in module.__all__:
        assert getattr(module, name) is not None, f"sume_poller.{package}.{name} does not resolve"


def test_the_checker_sees_an_upward_import_inside_a_function() -> None:
    store = LAYER / "store" / "records.py"
    found = list(_imports(store, "def f():\n    from ..poll.poller import Poller\n"))
    assert found == [("sume_poller.poll.poller", 2, False)]
    assert _rank(found[0][0]) > _rank(_name(store))
