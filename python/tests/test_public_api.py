"""The line between kolo's API and its machinery: a module is internal when its name (or a
package on its path) starts with ``_``; every other module is public, declares ``__all__`` and
documents every name in it; and every function and class of the private ``kolo._native`` is
used by a module a public module reaches (no dead binding).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any, Dict, List, Set

import pytest
from test_import_graph import import_graph, module_files

MODULES = module_files()


def is_internal(module: str) -> bool:
    """Whether ``module`` is internal (a part of its dotted name starts with ``_``)."""
    return any(part.startswith("_") for part in module.split("."))


PUBLIC = sorted(m for m in MODULES if not is_internal(m))


def _tree(module: str, modules: Dict[str, Path]) -> ast.Module:
    return ast.parse(modules[module].read_text())


def _assigned_here(tree: ast.Module, name: str) -> ast.stmt | None:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node
    return None


def _imported_from(tree: ast.Module, name: str) -> str | None:
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            if any((alias.asname or alias.name) == name for alias in node.names):
                return node.module
    return None


def constant_documented(module: str, name: str, modules: Dict[str, Path] = MODULES) -> bool:
    """Whether the constant ``name`` of ``module`` has a ``#:`` comment right above its
    assignment, or is named in its module's docstring (following ``from x import name``)."""
    tree = _tree(module, modules)
    docstring = ast.get_docstring(tree) or ""
    if f"``{name}``" in docstring or f"`{name}`" in docstring:
        return True
    node = _assigned_here(tree, name)
    if node is not None:
        lines = modules[module].read_text().splitlines()
        return node.lineno > 1 and lines[node.lineno - 2].strip().startswith("#:")
    source = _imported_from(tree, name)
    if source in modules:
        return constant_documented(source, name, modules)
    return False


@pytest.mark.parametrize("module", PUBLIC)
def test_a_public_module_declares_and_documents_its_names(module: str) -> None:
    loaded = importlib.import_module(module)
    assert (loaded.__doc__ or "").strip(), f"{module} has no docstring"
    names = getattr(loaded, "__all__", None)
    assert names is not None, f"{module} is public but has no __all__ (or make it internal: _name)"
    undocumented: List[str] = []
    for name in names:
        value = getattr(loaded, name)
        if inspect.isclass(value) or inspect.isroutine(value):
            if not (value.__doc__ or "").strip():
                undocumented.append(name)
        elif not inspect.ismodule(value) and not constant_documented(module, name):
            undocumented.append(name)
    assert not undocumented, f"{module}: no documentation for {', '.join(undocumented)}"


def native_uses(modules: Dict[str, Path] = MODULES) -> Dict[str, Set[str]]:
    """Module → the names of ``kolo._native`` it uses (``_native.x`` or ``from kolo._native
    import x``)."""
    uses: Dict[str, Set[str]] = {}
    for module in modules:
        found: Set[str] = set()
        for node in ast.walk(_tree(module, modules)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "_native":
                    found.add(node.attr)
            elif isinstance(node, ast.ImportFrom) and node.module == "kolo._native":
                found.update(alias.name for alias in node.names)
        uses[module] = found
    return uses


def reached_from_public(graph: Dict[str, Set[str]]) -> Set[str]:
    """Every module a public module imports, directly or not (the public ones included)."""
    reached: Set[str] = set()
    todo = [module for module in graph if not is_internal(module)]
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        todo.extend(graph.get(module, ()))
    return reached


def dead_bindings(bound: Set[str], modules: Dict[str, Path] = MODULES) -> Set[str]:
    """The names of ``bound`` that no module reached from a public module uses."""
    uses = native_uses(modules)
    reached = reached_from_public(import_graph(modules))
    return bound - set().union(*(uses.get(m, set()) for m in reached))


def callable_bindings(native: Any) -> Set[str]:
    """The functions and constructible classes of ``native``; a class Python cannot build
    (no constructor: only handed out by another binding, e.g. ``BufferView``) is left out."""
    names = set()
    for name in dir(native):
        value = getattr(native, name)
        if name.startswith("_") or (inspect.isclass(value) and issubclass(value, BaseException)):
            continue
        if inspect.isclass(value) and getattr(value, "__text_signature__", None) is None:
            continue
        names.add(name)
    return names


def test_every_native_function_is_reached_from_a_public_wrapper() -> None:
    from kolo import _native

    dead = dead_bindings(callable_bindings(_native))
    assert not dead, f"kolo._native binds what nothing public uses: {sorted(dead)}"


def test_the_checks_see_internal_modules_undocumented_constants_and_dead_bindings(
    tmp_path: Path,
) -> None:
    package = tmp_path / "kolo"
    package.mkdir()
    (package / "__init__.py").write_text('"""Root."""\n')
    (package / "_machinery.py").write_text("from kolo._native import used\n")
    (package / "_orphan.py").write_text("from kolo import _native\n_native.orphaned()\n")
    (package / "api.py").write_text(
        '"""Api."""\nimport kolo._machinery\n\nSIZE = 3\n\n#: Documented.\nLIMIT = 4\n'
    )
    modules = module_files(package)
    assert not is_internal("kolo.api") and is_internal("kolo._machinery")
    assert constant_documented("kolo.api", "LIMIT", modules)
    assert not constant_documented("kolo.api", "SIZE", modules)
    assert native_uses(modules)["kolo._orphan"] == {"orphaned"}
    # used by a module api.py imports; orphaned only by a module nothing public imports
    assert dead_bindings({"used", "orphaned", "unused"}, modules) == {"orphaned", "unused"}


#: Modules of kolo at f52c1f0 that were machinery with public-looking names and moved into the
#: estimator core or behind a ``_`` (issue 18): module → where its names went.
MOVED_MACHINERY = {
    "kolo.lightning.collectives": "kolo.lightning._collectives",
    "kolo.spark.common.checks": "kolo.estimator.checks",
    "kolo.spark.common.inference": "kolo.spark.common._inference",
    "kolo.spark.common.launch": "kolo.estimator.progress (GPU choice: kolo._rank_gpu)",
    "kolo.spark.common.training_params": "kolo.estimator.params",
    "kolo.spark.keras.params": "kolo.spark.common.params",
    "kolo.spark.keras.persistence": "kolo.spark.keras._persistence",
    "kolo.spark.lightning.params": "kolo.spark.common.params",
}

#: Names of kept modules that were re-exports of machinery: (module, name) → the new object.
MOVED_NAMES = {
    ("kolo.spark.keras.serde", "model_to_bytes"): "kolo.estimator.keras_trainer.model_to_bytes",
    ("kolo.spark.torch.remote", "Progress"): "kolo.estimator.progress.Progress",
    (
        "kolo.spark.torch.remote",
        "build_training_spec",
    ): "kolo.estimator.torch_spec.build_torch_spec",
    ("kolo.spark.torch.remote", "check_model_and_loss"): (
        "kolo.estimator.torch_spec.check_model_and_loss"
    ),
    ("kolo.spark.torch.remote", "check_rows_per_rank"): "kolo.estimator.checks.check_rows_per_rank",
    ("kolo.spark.torch.remote", "check_store_writable"): (
        "kolo.estimator.checks.check_store_writable"
    ),
    ("kolo.spark.torch.remote", "history_keys"): "(dead code: removed)",
    ("kolo.spark.torch.remote", "losses_from"): "kolo.estimator.torch_spec.losses_from",
    ("kolo.spark.torch.remote", "pickled"): "kolo.estimator.checks.pickled",
}


def test_the_public_names_of_f52c1f0_still_import() -> None:
    """Every public name kolo had before the estimator core was drawn (listed from f52c1f0)
    imports from the same path, but the machinery listed above."""
    fixture = Path(__file__).parent / "fixtures" / "public_names_f52c1f0.txt"
    lost = []
    for line in fixture.read_text().splitlines():
        module, name = line.split()
        if module in MOVED_MACHINERY or (module, name) in MOVED_NAMES:
            continue
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            lost.append(f"{module}.{name} ({err})")
    assert not lost, "public names that no longer import:\n" + "\n".join(lost)
    for module in MOVED_MACHINERY:
        with pytest.raises(ImportError):
            importlib.import_module(module)
    for target in MOVED_NAMES.values():
        if target.startswith("kolo."):
            module, _, name = target.rpartition(".")
            assert hasattr(importlib.import_module(module), name), f"{target} does not exist"
