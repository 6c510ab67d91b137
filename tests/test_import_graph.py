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
    """The room a module belongs to: supertune.train.lifecycle.run -> train; supertune.errors -> errors."""
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


# Inside federation/ the sub-packages stand in floors too, top first, held by the same rule: a module
# imports only its own room and rooms on lower floors. A room is a sub-package (each executor's
# package its own room); the package's own modules (run.py, docs.py, __init__.py) are "federation".
# The agents' sites run their work with the built-in executor, so agents stands above builtin.
FEDERATION_LAYERS: tuple[tuple[str, ...], ...] = (
    ("federation",),
    ("executors",),
    ("executors.agents", "executors.streamflow"),
    ("executors.builtin",),
    ("rounds",),
    ("reports",),
    ("state",),
    ("config",),
)
FEDERATION = PACKAGE / "federation"


def _federation_room(module: str) -> str:
    """supertune.federation.rounds.quorum -> rounds; ...executors.builtin.executor -> executors.builtin;
    supertune.federation.run -> federation."""
    parts = module.split(".")[2:]
    if not parts or not (FEDERATION / parts[0]).is_dir():
        return "federation"
    if parts[0] == "executors" and len(parts) > 1 and (FEDERATION / "executors" / parts[1]).is_dir():
        return f"executors.{parts[1]}"
    return parts[0]


def _federation_upward(graph: dict[str, set[str]]) -> list[str]:
    floor = {room: i for i, rooms in enumerate(FEDERATION_LAYERS) for room in rooms}
    upward = []
    for module, targets in sorted(graph.items()):
        if not module.startswith("supertune.federation"):
            continue
        here = _federation_room(module)
        for target in sorted(t for t in targets if t.startswith("supertune.federation")):
            there = _federation_room(target)
            if there != here and floor[there] <= floor[here]:
                upward.append(f"{module} -> {target} ({here} on floor {floor[here]}, {there} on floor {floor[there]})")
    return upward


def test_every_federation_room_has_a_floor():
    floor = [room for rooms in FEDERATION_LAYERS for room in rooms]
    assert len(floor) == len(set(floor)), "a room stands on two floors"
    rooms = {_federation_room(m) for m in _imports() if m.startswith("supertune.federation")}
    assert rooms - {"federation"}, "federation has no sub-packages"
    missing = sorted(rooms - set(floor))
    assert missing == [], f"federation's sub-packages without a floor in FEDERATION_LAYERS: {missing}"


def test_every_import_inside_federation_runs_down():
    upward = _federation_upward(_imports())
    assert upward == [], "federation imports that do not run down:\n" + "\n".join(upward)


def test_the_federation_layer_rule_can_fail():
    graph = {
        "supertune.federation.config.load": {"supertune.federation.state.layout"},
        "supertune.federation.executors.streamflow.executor": {"supertune.federation.executors.agents.coordinator"},
        "supertune.federation.rounds.loop": {"supertune.federation.reports.table"},
    }
    assert _federation_upward(graph) == [
        "supertune.federation.config.load -> supertune.federation.state.layout (config on floor 7, state on floor 6)",
        "supertune.federation.executors.streamflow.executor -> supertune.federation.executors.agents.coordinator "
        "(executors.streamflow on floor 2, executors.agents on floor 2)",
    ]


def _private_imports() -> list[str]:
    """`from module import _name` of one of supertune's own modules: a private name used outside its module."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("supertune")):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {alias.name}")
    return found


def test_no_private_name_is_imported_across_modules():
    private = _private_imports()
    assert private == [], "private names imported from another module:\n" + "\n".join(private)


def _defined(path: Path) -> set[str] | None:
    """The names a module defines at its top (None: it has a module __getattr__, and may define any)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:` and fallbacks
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    names |= {(a.asname or a.name).split(".")[0] for a in inner.names}
                elif isinstance(inner, (ast.FunctionDef, ast.ClassDef)):
                    names.add(inner.name)
                elif isinstance(inner, ast.Assign):
                    names |= {t.id for t in inner.targets if isinstance(t, ast.Name)}
    return names


def _unresolved_imports() -> list[str]:
    """Imports of supertune's own modules (at the top or inside functions) that name a module or a name
    it does not have: what a moved module leaves behind in a function that no quick test runs."""
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    found = []
    for name, path in sorted(files.items()):
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            if not base.startswith("supertune"):
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            if base not in files:
                found.append(f"{where}: no module {base}")
                continue
            defined = _defined(files[base])
            for alias in node.names:
                if f"{base}.{alias.name}" not in files and defined is not None and alias.name not in defined:
                    found.append(f"{where}: {base} has no {alias.name}")
    return found


def test_every_import_names_what_exists():
    assert _unresolved_imports() == []
