"""Imports flow one way: spec -> reference -> implementations -> export / conformance -> the command
(aiayn_conformance/) -> benchmarks, with no cycle between modules, function-local imports included.

Modules are named as installed: the folder spec/ is the package aiayn_conformance.spec (pyproject.toml's
package-dir), and so on; benchmarks/ is not installed and keeps its own name."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"spec": 0, "reference": 1, "implementations": 2, "export": 3, "conformance": 3, "aiayn_conformance": 4,
          "benchmarks": 5}
NAMESPACE = "aiayn_conformance"


def installed_name(folder: str) -> str:
    """The package a top-level folder is installed as."""
    return folder if folder in (NAMESPACE, "benchmarks") else f"{NAMESPACE}.{folder}"


def layer(module: str) -> int:
    """The layer of an installed module name: its folder's."""
    for folder in LAYERS:
        if folder not in (NAMESPACE,) and (module == installed_name(folder) or
                                           module.startswith(installed_name(folder) + ".")):
            return LAYERS[folder]
    return LAYERS[NAMESPACE]


def modules() -> dict[str, Path]:
    found = {}
    for folder in LAYERS:
        for path in (ROOT / folder).rglob("*.py"):
            if any((ROOT / part).is_symlink() for part in path.relative_to(ROOT).parents if str(part) != "."):
                continue  # aiayn_conformance/spec -> ../spec and its siblings: the mypy view of the namespace
            name = ".".join((installed_name(folder), *path.relative_to(ROOT / folder).with_suffix("").parts))
            found[name.removesuffix(".__init__")] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its body (``from . import x`` counts as ``pkg.x``)."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                targets = subs + ([base] if len(subs) < len(node.names) else [])
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_flow_one_way():
    upward = [f"{m} -> {t}" for m, ts in import_graph().items() for t in ts
              if layer(t) > layer(m)]
    assert upward == [], f"imports against the layering {LAYERS}: {upward}"


def test_modules_are_named_as_installed():
    mods = modules()
    assert "aiayn_conformance.spec.config" in mods and "aiayn_conformance.cli" in mods
    assert layer("aiayn_conformance.spec.config") == 0 and layer("aiayn_conformance.cli") == 4
    assert layer("aiayn_conformance.implementations.builtins.fused") == 2
