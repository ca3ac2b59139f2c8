"""Horovod's source at a tag, read from a git mirror and parsed with ``ast`` (never imported).

:class:`HorovodSource` answers what a module binds (definitions and imports, resolved to where
they are defined) and the signatures of functions, constructors and methods.

Example::

    src = HorovodSource("/work/.mirror/horovod+horovod/repo", "v0.28.1")
    src.resolve("horovod.torch", "allreduce")["signature"][0]["name"]   # 'tensor'
"""

from __future__ import annotations

import ast
import subprocess
from typing import Any, Dict, Iterator, List, Optional, Tuple

Entry = Dict[str, Any]

_ARG_KINDS = (
    "positional_only",
    "positional_or_keyword",
    "var_positional",
    "keyword_only",
    "var_keyword",
)


class HorovodSource:
    """The Python modules of Horovod at ``tag`` in the bare git repository ``git_dir``."""

    def __init__(self, git_dir: str, tag: str) -> None:
        self.git_dir = git_dir
        self.tag = tag
        self._trees: Dict[str, ast.Module] = {}
        self._bindings: Dict[str, Dict[str, Tuple[str, Any]]] = {}
        listing = self._git("ls-tree", "-r", "--name-only", tag, "horovod/")
        self.paths: Dict[str, str] = {}
        for path in listing.splitlines():
            if not path.endswith(".py"):
                continue
            parts = path[: -len(".py")].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            self.paths[".".join(parts)] = path

    def _git(self, *args: str) -> str:
        return subprocess.run(
            ["git", f"--git-dir={self.git_dir}", *args],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def read(self, path: str) -> str:
        """The text of ``path`` at the tag."""
        return self._git("show", f"{self.tag}:{path}")

    def is_package(self, module: str) -> bool:
        """Whether ``module`` is a package (an ``__init__.py``)."""
        return self.paths.get(module, "").endswith("__init__.py")

    def tree(self, module: str) -> ast.Module:
        """The parsed source of ``module``."""
        if module not in self._trees:
            self._trees[module] = ast.parse(self.read(self.paths[module]))
        return self._trees[module]

    def bindings(self, module: str) -> Dict[str, Tuple[str, Any]]:
        """Every top-level name ``module`` binds → ``("def", node)``, ``("class", node)``,
        ``("assign", value node)``, ``("import", (source module, source name))`` or
        ``("module", dotted name)``, in source order (later bindings win), looking into
        top-level ``if``/``try`` blocks."""
        if module not in self._bindings:
            self._bindings[module] = self._collect_bindings(module)
        return self._bindings[module]

    def _collect_bindings(self, module: str) -> Dict[str, Tuple[str, Any]]:
        found: Dict[str, Tuple[str, Any]] = {}
        for stmt in _top_level(self.tree(module).body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[stmt.name] = ("def", stmt)
            elif isinstance(stmt, ast.ClassDef):
                found[stmt.name] = ("class", stmt)
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = ("assign", stmt.value)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                found[stmt.target.id] = ("assign", stmt.value)
            elif isinstance(stmt, ast.ImportFrom):
                source = self._absolute(module, stmt)
                for alias in stmt.names:
                    if alias.name == "*":
                        for name in self.star_names(source):
                            found[name] = ("import", (source, name))
                        continue
                    submodule = f"{source}.{alias.name}"
                    if submodule in self.paths:
                        found[alias.asname or alias.name] = ("module", submodule)
                    else:
                        found[alias.asname or alias.name] = ("import", (source, alias.name))
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        found[alias.asname] = ("module", alias.name)
        return found

    def star_names(self, module: str) -> List[str]:
        """What ``from module import *`` binds (``__all__``, else the public names)."""
        if module not in self.paths:
            return []
        declared = self.declared_all(module)
        if declared is not None:
            return declared
        return [name for name in self.bindings(module) if not name.startswith("_")]

    def declared_all(self, module: str) -> Optional[List[str]]:
        """``module.__all__`` when it is a literal list, else None."""
        kind, value = self.bindings(module).get("__all__", (None, None))
        if kind == "assign" and isinstance(value, (ast.List, ast.Tuple)):
            return [ast.literal_eval(elt) for elt in value.elts]
        return None

    def _absolute(self, module: str, stmt: ast.ImportFrom) -> str:
        if not stmt.level:
            return stmt.module or ""
        base = module.split(".")
        if not self.is_package(module):
            base = base[:-1]
        base = base[: len(base) - (stmt.level - 1)]
        return ".".join(base + ([stmt.module] if stmt.module else []))

    # -- resolution ------------------------------------------------------------------------------

    def resolve(self, module: str, name: str, depth: int = 0) -> Entry:
        """What ``module.name`` is: ``{"kind", "defined_in", "signature"?}``; kind is
        ``function``, ``class``, ``module`` or ``value`` (``external`` for a name imported
        from outside Horovod)."""
        if depth > 20:
            raise RecursionError(f"import cycle resolving {module}.{name}")
        kind, node = self.bindings(module).get(name, (None, None))
        if kind == "def":
            return {
                "kind": "function",
                "defined_in": f"{module}.{name}",
                "signature": self._function_signature(module, node),
            }
        if kind == "class":
            return {
                "kind": "class",
                "defined_in": f"{module}.{name}",
                "signature": self.constructor_signature(module, node),
            }
        if kind == "module":
            return {"kind": "module", "defined_in": node}
        if kind == "import":
            source, source_name = node
            if not source.startswith("horovod") or source not in self.paths:
                return {"kind": "external", "defined_in": f"{source}.{source_name}"}
            return self.resolve(source, source_name, depth + 1)
        if kind == "assign":
            return self._resolve_assignment(module, name, node, depth)
        raise KeyError(f"{module} does not bind {name}")

    def _resolve_assignment(self, module: str, name: str, value: Any, depth: int) -> Entry:
        if isinstance(value, ast.Name) and value.id in self.bindings(module):
            return self.resolve(module, value.id, depth + 1)
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
            owner = self._instance_class(module, value.value.id)
            if owner is not None:
                method = self.find_method(*owner, value.attr)
                if method is not None:
                    return {
                        "kind": "function",
                        "defined_in": f"{method[0]}.{method[1].name}.{method[2].name}",
                        "signature": self._function_signature(method[0], method[2], bound=True),
                    }
        return {"kind": "value", "defined_in": f"{module}.{name}"}

    def _instance_class(self, module: str, name: str) -> Optional[Tuple[str, ast.ClassDef]]:
        """The class ``name`` was made from when ``module`` binds ``name = SomeClass(...)``."""
        kind, value = self.bindings(module).get(name, (None, None))
        if kind != "assign" or not isinstance(value, ast.Call):
            return None
        if not isinstance(value.func, ast.Name):
            return None
        return self.class_node(module, value.func.id)

    def class_node(self, module: str, name: str, depth: int = 0) -> Optional[Tuple[str, Any]]:
        """``(defining module, ClassDef)`` of the class ``module.name``, if Horovod defines it."""
        kind, node = self.bindings(module).get(name, (None, None))
        if kind == "class":
            return module, node
        if kind == "import" and node[0] in self.paths and depth < 20:
            return self.class_node(node[0], node[1], depth + 1)
        return None

    def bases(self, module: str, cls: ast.ClassDef) -> Iterator[Tuple[str, ast.ClassDef]]:
        """The Horovod-defined classes in ``cls``'s method resolution order, ``cls`` first
        (depth-first over the bases, each class once)."""
        seen = set()
        stack = [(module, cls)]
        while stack:
            mod, node = stack.pop(0)
            key = (mod, node.name)
            if key in seen:
                continue
            seen.add(key)
            yield mod, node
            parents = []
            for base in node.bases:
                found = self.class_node(mod, base.id) if isinstance(base, ast.Name) else None
                if found is not None:
                    parents.append(found)
            stack = parents + stack

    def find_method(
        self, module: str, cls: ast.ClassDef, method: str
    ) -> Optional[Tuple[str, ast.ClassDef, Any]]:
        """``(module, class, FunctionDef)`` defining ``method`` for ``cls`` (its own or a
        Horovod base class's)."""
        for mod, node in self.bases(module, cls):
            for stmt in node.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if stmt.name == method:
                        return mod, node, stmt
        return None

    def methods(self, module: str, cls: ast.ClassDef) -> Dict[str, Entry]:
        """The public methods of ``cls`` with those inherited from Horovod base classes:
        ``{name: {"kind": "method"|"staticmethod"|"classmethod"|"property", "defined_in",
        "signature"?}}`` in definition order, own methods first."""
        found: Dict[str, Entry] = {}
        for mod, node in self.bases(module, cls):
            for stmt in node.body:
                if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if stmt.name.startswith("_") or stmt.name in found:
                    continue
                decorators = {_decorator_name(d) for d in stmt.decorator_list}
                kind = next(
                    (k for k in ("property", "staticmethod", "classmethod") if k in decorators),
                    "method",
                )
                entry: Entry = {"kind": kind, "defined_in": f"{mod}.{node.name}"}
                if kind != "property":
                    entry["signature"] = self._function_signature(
                        mod, stmt, bound=kind != "staticmethod"
                    )
                found[stmt.name] = entry
        return found

    def constructor_signature(self, module: str, cls: ast.ClassDef) -> Optional[List[Entry]]:
        """The parameters of ``cls(...)``: its (or a Horovod base's) ``__init__`` without
        ``self``; None when the constructor comes from outside Horovod."""
        found = self.find_method(module, cls, "__init__")
        if found is None:
            external = any(_has_external_base(node) for _, node in self.bases(module, cls))
            return None if external else []
        return self._function_signature(found[0], found[2], bound=True)

    def _function_signature(self, module: str, node: Any, bound: bool = False) -> List[Entry]:
        """Parameters of a def (``bound``: without the first); ``@keyword_only`` makes them
        keyword-only (PySpark's decorator rejects positional arguments); a ``(*args, **kwargs)``
        wrapper that forwards to ``instance.method(*args, **kwargs)`` takes that method's."""
        forwarded = self._forwarded_signature(module, node)
        if forwarded is not None:
            return forwarded
        args = node.args
        keyword_only = "keyword_only" in {_decorator_name(d) for d in node.decorator_list}
        positional = [*args.posonlyargs, *args.args]
        defaults: List[Any] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        params: List[Entry] = []
        for index, (arg, default) in enumerate(zip(positional, defaults)):
            if bound and index == 0:
                continue
            kind = "positional_only" if index < len(args.posonlyargs) else "positional_or_keyword"
            if keyword_only:
                kind = "keyword_only"
            params.append(_param(arg.arg, kind, default))
        if args.vararg:
            params.append(_param(args.vararg.arg, "var_positional", None))
        for arg, default in zip(args.kwonlyargs, args.kw_defaults):
            params.append(_param(arg.arg, "keyword_only", default))
        if args.kwarg:
            params.append(_param(args.kwarg.arg, "var_keyword", None))
        return params

    def _forwarded_signature(self, module: str, node: Any) -> Optional[List[Entry]]:
        args = node.args
        if args.args or args.kwonlyargs or not (args.vararg and args.kwarg):
            return None
        for call in ast.walk(node):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                continue
            if not isinstance(call.func.value, ast.Name):
                continue
            star = [a for a in call.args if isinstance(a, ast.Starred)]
            if not star or not any(k.arg is None for k in call.keywords):
                continue
            owner = self._instance_class(module, call.func.value.id)
            if owner is None:
                continue
            method = self.find_method(*owner, call.func.attr)
            if method is not None:
                return self._function_signature(method[0], method[2], bound=True)
        return None


def _top_level(body: List[ast.stmt]) -> Iterator[ast.stmt]:
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _top_level(stmt.body)
            yield from _top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from _top_level(stmt.body)
            for handler in stmt.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(stmt.orelse)
            yield from _top_level(stmt.finalbody)
        else:
            yield stmt


def _decorator_name(node: Any) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _has_external_base(cls: ast.ClassDef) -> bool:
    return any(not (isinstance(b, ast.Name) and b.id == "object") for b in cls.bases)


def _param(name: str, kind: str, default: Any) -> Entry:
    assert kind in _ARG_KINDS, kind
    entry: Entry = {"name": name, "kind": kind}
    if default is not None:
        entry["default"] = ast.unparse(default)
    return entry
