"""The import graph of the ``kolo`` package: no cycles, and every arrow points down the layers of
``docs/architecture.md`` (launchers → estimator core → framework adapters → shared core →
``kolo._native``), with the launchers independent of each other.

Every ``import`` statement counts, wherever it stands (module level, inside a function, under
``TYPE_CHECKING``): an import inside a function is still a dependency. ``from a import b``
is an edge to the module ``a.b`` when there is one, else to ``a``. Importing ``a.b`` also
runs ``a/__init__.py``; those implicit edges to parent packages do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kolo"

#: Layers from the top; a module may import its own layer or any layer below it.
LAYERS: List[List[str]] = [
    ["kolo.runner", "kolo.spark", "kolo.ray"],
    ["kolo.estimator"],
    ["kolo.torch", "kolo.tensorflow", "kolo.keras", "kolo.lightning"],
    [
        "kolo",
        "kolo._allocator",
        "kolo._core",
        "kolo._env",
        "kolo._launch_times",
        "kolo._lifecycle",
        "kolo._mpi_launch",
        "kolo._mpirun",
        "kolo._nics",
        "kolo._rank_gpu",
        "kolo._rank_process",
        "kolo._run",
        "kolo._store_filesystem",
        "kolo.common",
        "kolo.data",
        "kolo.elastic",
        "kolo.exceptions",
        "kolo.process_sets",
        "kolo.store",
    ],
    ["kolo._native"],
]

#: Groups of the same layer that must not import each other.
INDEPENDENT: List[List[str]] = [["kolo.runner", "kolo.spark", "kolo.ray"]]


def module_files(root: Path = PACKAGE) -> Dict[str, Path]:
    """Module name → file of every Python module of the package under ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _target(name: str, modules: Dict[str, Path]) -> Optional[str]:
    """The module of ``name`` (a module, or a name inside one), inside the package or native."""
    while name:
        if name in modules or name == "kolo._native":
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(modules: Optional[Dict[str, Path]] = None) -> Dict[str, Set[str]]:
    """Module → the package modules it imports (explicitly; see the module docstring)."""
    modules = module_files() if modules is None else modules
    graph: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")
                    parent = parent[: len(parent) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                names = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for imported in names:
                target = _target(imported, modules)
                if target is not None and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _group(module: str, groups: List[str]) -> Optional[str]:
    """The longest of ``groups`` that is ``module`` or a package holding it (the root package
    ``kolo`` holds nothing but itself: every other module is listed)."""
    best = None
    for group in groups:
        if module == group or (group != "kolo" and module.startswith(group + ".")):
            if best is None or len(group) > len(best):
                best = group
    return best


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (0 is the top)."""
    every = [group for layer in LAYERS for group in layer]
    group = _group(module, every)
    if group is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS")
    return next(i for i, layer in enumerate(LAYERS) if group in layer)


def forbidden_edges(graph: Dict[str, Set[str]]) -> List[str]:
    """Each edge that points up a layer or joins two independent groups, as ``a -> b (why)``."""
    found = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) < layer_of(source):
                found.append(f"{source} -> {target} (points up the layers)")
                continue
            for groups in INDEPENDENT:
                a, b = _group(source, groups), _group(target, groups)
                if a is not None and b is not None and a != b:
                    found.append(f"{source} -> {target} ({a} and {b} are independent)")
    return found


def test_the_package_has_no_import_cycle() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_every_import_points_down_the_layers() -> None:
    edges = forbidden_edges(import_graph())
    assert not edges, "forbidden imports:\n" + "\n".join(edges)


def test_the_graph_sees_imports_inside_functions(tmp_path: Path) -> None:
    package = tmp_path / "kolo"
    (package / "spark").mkdir(parents=True)
    (package / "torch").mkdir()
    (package / "__init__.py").write_text("")
    (package / "spark" / "__init__.py").write_text("from kolo.torch import ops\n")
    (package / "torch" / "__init__.py").write_text("")
    (package / "torch" / "ops.py").write_text(
        "def f():\n    from ..spark import run\n    import kolo._native\n"
    )
    graph = import_graph(module_files(package))
    assert graph["kolo.torch.ops"] == {"kolo.spark", "kolo._native"}
    assert graph["kolo.spark"] == {"kolo.torch.ops"}
    assert find_cycles(graph) == [["kolo.spark", "kolo.torch.ops"]]
    assert forbidden_edges(graph) == ["kolo.torch.ops -> kolo.spark (points up the layers)"]


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("kolo.ray.estimator", "kolo.spark.torch.remote"),
        ("kolo.spark.runner", "kolo.ray.executor"),
        ("kolo.lightning.strategy", "kolo.spark.task"),
        ("kolo.keras.optimizer", "kolo.ray"),
        ("kolo.torch.ops", "kolo.estimator"),
        ("kolo.estimator", "kolo.spark"),
    ],
)
def test_a_forbidden_edge_is_reported(source: str, target: str) -> None:
    graph = import_graph()
    assert source in graph and _target(target, module_files()) == target
    graph[source] = {*graph[source], target}
    assert any(edge.startswith(f"{source} -> {target} ") for edge in forbidden_edges(graph))
