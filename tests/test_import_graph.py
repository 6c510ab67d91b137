"""No import circle inside the package: every `import` and `from ... import` of supertune's own
modules (at the top of a file or inside a function) is an edge, and the graph has no cycle. A circle
means two modules each need the other to be understood, and it is how the run config and the
cluster profiles once came to re-apply a profile to a resolved config."""

from __future__ import annotations

import ast
from pathlib import Path

import supertune

PACKAGE = Path(supertune.__file__).parent


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([node.module] if node.module else []))
                for alias in node.names:
                    # `from .pkg import module` imports a module; `from .module import name` the module.
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                    if target in files and target != name:
                        graph[name].add(target)
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in files and a.name != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_the_package():
    graph = _imports()
    assert len(graph) > 100
    assert "supertune.config.schema" in graph["supertune.resolve.resolve"]
    assert "supertune.clusters.registry" in graph["supertune.clusters"]  # relative imports are followed


def test_no_import_circle():
    assert _cycles(_imports()) == []


def test_the_run_config_knows_nothing_of_cluster_profiles():
    graph = _imports()
    config = [m for m in graph if m.startswith("supertune.config")]
    assert config
    for module in config:
        assert not any(t.startswith(("supertune.clusters", "supertune.resolve")) for t in graph[module]), module
