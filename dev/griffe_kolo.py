"""Griffe extensions for the docs site's API reference (mkdocs.yml lists this file under the
mkdocstrings handler's ``extensions``): what static analysis alone does not see in kolo.

- ``kolo._native``: Griffe merges the compiled module with ``kolo/_native.pyi`` (the stub). The
  stub's classes have no docstrings (the exception classes' docstrings live in the Rust source,
  ``python/src/error.rs``), so each class gets the compiled class's docstring and
  ``kolo.exceptions`` renders the text Python's ``help()`` shows; an attribute gets the stub's
  docstring, not the one inspection finds (``__version__``'s would be ``str``'s). Only
  ``kolo._native`` is imported, not the frameworks.
- Module attributes documented the Sphinx way, with ``#:`` comment lines right above them
  (``#: Reduce by summing over the ranks.`` / ``Sum = ReduceOp.Sum``), get those lines as their
  docstring.
- ``kolo.spark.torch``, ``.keras``, ``.lightning`` export their estimators through a lazy module
  ``__getattr__ = lazy_names(__name__, {name: home module})`` (importing them needs neither
  PySpark nor the framework); each name becomes an alias of ``home.name``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
from pathlib import Path

import griffe

_NATIVE = "kolo._native"


class NativeDocstrings(griffe.Extension):
    """Docstrings of ``kolo._native``: a class's from the compiled module, an attribute's from
    the stub."""

    def on_class_instance(self, *, cls: griffe.Class, **kwargs) -> None:
        """Copy ``kolo._native.<Name>.__doc__`` onto the stub class ``cls`` when it has none."""
        if cls.docstring is not None or cls.parent is None or cls.parent.path != _NATIVE:
            return
        doc = getattr(importlib.import_module(_NATIVE), cls.name, None).__doc__
        if doc:
            cls.docstring = griffe.Docstring(inspect.cleandoc(doc), parent=cls)

    def on_attribute_instance(self, *, attr: griffe.Attribute, **kwargs) -> None:
        """Give a ``kolo._native`` attribute the docstring the stub writes under it, or none."""
        if attr.parent is None or attr.parent.path != _NATIVE:
            return
        doc = _stub_attribute_docstrings().get(attr.name)
        attr.docstring = griffe.Docstring(doc, parent=attr) if doc else None


@functools.cache
def _stub_attribute_docstrings() -> dict[str, str]:
    """``{name: docstring}`` of the attributes ``kolo/_native.pyi`` documents."""
    stub = Path(importlib.util.find_spec(_NATIVE).origin).with_name("_native.pyi")
    body = ast.parse(stub.read_text()).body
    return {
        node.target.id: inspect.cleandoc(after.value.value)
        for node, after in zip(body, body[1:])
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    }


class SphinxCommentDocstrings(griffe.Extension):
    """Reads the ``#:`` comment lines above an attribute as its docstring."""

    def on_attribute_instance(self, *, attr: griffe.Attribute, **kwargs) -> None:
        """Set ``attr``'s docstring from the ``#:`` lines right above it, when it has none."""
        if attr.docstring is not None or attr.lineno is None or attr.filepath is None:
            return
        lines = (
            attr.lines_collection[attr.filepath] if attr.filepath in attr.lines_collection else []
        )
        comment: list[str] = []
        index = attr.lineno - 2
        while index >= 0 and lines[index].strip().startswith("#:"):
            comment.insert(0, lines[index].strip()[2:].strip())
            index -= 1
        if comment:
            attr.docstring = griffe.Docstring("\n".join(comment), parent=attr)


class LazyNames(griffe.Extension):
    """Turns ``__getattr__ = lazy_names(__name__, {...})`` into aliases of the lazy names."""

    def on_module_members(self, *, node, mod: griffe.Module, **kwargs) -> None:
        """Add ``mod.<name>`` as an alias of ``<home>.<name>`` for each lazily imported name."""
        if not isinstance(node, ast.Module):
            return
        for statement in node.body:
            homes = _lazy_homes(statement)
            for name, home in homes.items():
                mod.set_member(name, griffe.Alias(name, f"{home}.{name}", parent=mod))


def _lazy_homes(statement: ast.stmt) -> dict[str, str]:
    """``{name: home}`` of a ``__getattr__ = lazy_names(__name__, {...})`` statement, else {}."""
    if not (
        isinstance(statement, ast.Assign)
        and [getattr(t, "id", None) for t in statement.targets] == ["__getattr__"]
        and isinstance(statement.value, ast.Call)
        and getattr(statement.value.func, "id", None) == "lazy_names"
        and len(statement.value.args) == 2
        and isinstance(statement.value.args[1], ast.Dict)
    ):
        return {}
    table = statement.value.args[1]
    return {key.value: value.value for key, value in zip(table.keys, table.values)}
