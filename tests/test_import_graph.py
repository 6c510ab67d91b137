"""The house's import rules. Every `import` and `from ... import` of supertune's own modules (at the
top of a file or inside a function) is an edge.

- No circle: a circle means two modules each need the other to be understood, and it is how the run
  config and the cluster profiles once came to re-apply a profile to a resolved config.
- Every import runs down: the packages stand in floors (LAYERS, top first, as docs/architecture.md
  draws them), and a module imports only its own package and packages on lower floors. Packages on
  one floor do not import each other. A new package gets a floor here before it lands.
"""

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


# Top floor first. A root module (supertune/errors.py) is its own "package", named by its module.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__",),
    ("cli",),
    ("federation", "sweeps"),
    ("runs",),
    ("train",),
    ("benchmarks",),
    ("evaluation", "telemetry", "tracking"),
    ("resolve",),
    ("slurm", "training_data", "container"),
    ("doctor", "store", "averaging"),
    ("distributed", "modeling"),
    ("documents", "conversations", "clusters", "transfer", "exchange"),
    ("config",),
    ("launch", "embedded", "hub", "checkpoints", "weight_files"),
    (
        "entry",
        "rundir",
        "subprocesses",
        "json_lines",
        "file_table",
        "file_formats",
        "byte_sizes",
        "exit_codes",
        "paths",
    ),
    ("output_dirs",),
    ("state_records", "durable_files"),
    ("errors", "supertune"),
)

# Imports that run up on purpose (a plug-in point), each with the reason; none today. The one table
# of internal process entry points (supertune/entry.py) stands on the bottom floors so that every
# layer may name an entry; it imports the chosen entry's module by name (importlib), which this walk
# does not follow, and only in the process that entry starts.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


def _package(module: str) -> str:
    """The room a module belongs to: supertune.train.run -> train; supertune.errors -> errors."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "supertune"


def _floor() -> dict[str, int]:
    return {package: i for i, floor in enumerate(LAYERS) for package in floor}


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


def test_every_package_has_a_floor():
    floor = _floor()
    assert len(floor) == sum(len(f) for f in LAYERS), "a package stands on two floors"
    missing = sorted({_package(m) for m in _imports()} - set(floor))
    assert missing == [], (
        f"packages without a floor in LAYERS: {missing}; give each one in tests/test_import_graph.py and docs/architecture.md"
    )


def _upward(graph: dict[str, set[str]]) -> list[str]:
    floor = _floor()
    upward = []
    for module, targets in sorted(graph.items()):
        here = _package(module)
        for target in sorted(targets):
            there = _package(target)
            if there == here or (here, there) in ALLOWED_UPWARD:
                continue
            if floor[there] <= floor[here]:
                upward.append(f"{module} -> {target} ({here} on floor {floor[here]}, {there} on floor {floor[there]})")
    return upward


def test_every_import_runs_down():
    upward = _upward(_imports())
    assert upward == [], "imports that do not run down:\n" + "\n".join(upward)


def test_the_layer_rule_can_fail():
    """An import up a floor and one across a floor are both reported; one down is not."""
    graph = {
        "supertune.config.schema": {"supertune.cli.main", "supertune.errors"},
        "supertune.store.writer": {"supertune.doctor.probe"},
    }
    assert _upward(graph) == [
        "supertune.config.schema -> supertune.cli.main (config on floor 12, cli on floor 1)",
        "supertune.store.writer -> supertune.doctor.probe (store on floor 9, doctor on floor 9)",
    ]
