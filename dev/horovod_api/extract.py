"""Writes Horovod 0.28.1's public API as a data file: names with signatures, the methods of
its classes, horovodrun's flags, the Spark estimators' constructor parameters and accessors,
the store methods.

Reads the source from a bare git mirror of Horovod with ``ast`` (Horovod is never imported).

Example::

    python dev/horovod_api/extract.py    # writes python/tests/fixtures/horovod_api_0.28.1.json
    python dev/horovod_api/extract.py --git-dir /path/to/horovod.git --out /tmp/api.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))

from api_scope import (
    ESTIMATOR_CLASSES,
    EXAMPLE_IMPORTS,
    NO_HARDWARE,
    NO_HARDWARE_FLAGS,
    NOT_API,
    PUBLIC_MODULES,
    STORE_MODULE,
    internal_reason,
    module_scope,
    name_scope,
)
from horovod_source import HorovodSource
from launcher_flags import launcher_flags

TAG = "v0.28.1"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_GIT_DIR = "/work/.mirror/horovod+horovod/repo"
DEFAULT_OUT = REPO / "python" / "tests" / "fixtures" / "horovod_api_0.28.1.json"

#: Modules whose names a package ``__init__.py`` imports for its own use, not to re-export.
_GLUE = ("horovod.common.util", "horovod.common.basics")

_ACCESSOR = re.compile(r"^(get|set)[A-Z]")


def module_names(src: HorovodSource, module: str) -> List[str]:
    """The public names of ``module``: ``__all__``, ``__version__``, what it defines and, for
    a package, what its ``__init__.py`` re-exports from Horovod's modules (but the
    native-library glue it imports for its own use)."""
    names = list(src.declared_all(module) or [])
    for name, (kind, node) in src.bindings(module).items():
        if (name.startswith("_") and name != "__version__") or name in names:
            continue
        if name in NOT_API.get(module, []):
            continue
        if kind in ("def", "class", "assign"):
            names.append(name)
        elif kind == "import" and src.is_package(module) and _reexported(src, *node):
            names.append(name)
        elif kind == "module" and node in PUBLIC_MODULES and node.startswith(module + "."):
            names.append(name)
    return names


def _reexported(src: HorovodSource, source: str, name: str) -> bool:
    return source in src.paths and source not in _GLUE and name in src.bindings(source)


def name_entry(src: HorovodSource, module: str, name: str, owner: Dict[str, str]) -> Dict:
    """One name's row: where it is defined, its kind and signature, and its scope."""
    submodule = f"{module}.{name}"
    if submodule in src.paths and name not in src.bindings(module):
        resolved: Dict[str, Any] = {"kind": "module", "defined_in": submodule}
    else:
        resolved = src.resolve(module, name)
    return {"module": module, "name": name, **resolved, "scope": owner}


def public_names(src: HorovodSource) -> List[Dict]:
    """Every public name of :data:`PUBLIC_MODULES` and :data:`EXAMPLE_IMPORTS`."""
    rows = []
    for module in PUBLIC_MODULES:
        for name in module_names(src, module):
            rows.append(name_entry(src, module, name, name_scope(module, name)))
    for module, name, owner in EXAMPLE_IMPORTS:
        scope = (
            {"owner": owner}
            if owner == name_scope(module, name)["owner"]
            else {
                "owner": owner,
                "reason": "used by Horovod's elastic example",
            }
        )
        rows.append(name_entry(src, module, name, scope))
    return rows


def flags(src: HorovodSource) -> List[Dict]:
    """Horovodrun's flags, all in scope (elastic and autotune ones included); the effect of
    ``--jsrun``/``--torus-allreduce``/``--num-nccl-streams`` is hardware's this project lacks."""
    rows = launcher_flags(src.read("horovod/runner/launch.py"))
    for row in rows:
        row["scope"] = {"owner": module_scope("horovod.runner.launch")["owner"]}
        if row["dest"] in NO_HARDWARE_FLAGS:
            row["effect_owner"] = NO_HARDWARE
    return rows


def _class(src: HorovodSource, dotted: str):
    module, name = dotted.rsplit(".", 1)
    found = src.class_node(module, name)
    if found is None:
        raise LookupError(f"{dotted} is not a class defined by Horovod")
    return found


def estimator_params(src: HorovodSource) -> List[Dict]:
    """The constructor parameters of each estimator and model class (inherited ones
    included: the ``@keyword_only __init__`` that applies to the class)."""
    rows = []
    for dotted in ESTIMATOR_CLASSES:
        module, node = _class(src, dotted)
        scope = module_scope(dotted.rsplit(".", 1)[0])
        for param in src.constructor_signature(module, node) or []:
            rows.append({"class": dotted, **param, "scope": scope})
    return rows


def accessors(src: HorovodSource) -> List[Dict]:
    """The ``getX``/``setX`` methods of each estimator and model class (with inherited)."""
    rows = []
    for dotted in ESTIMATOR_CLASSES:
        module, node = _class(src, dotted)
        scope = module_scope(dotted.rsplit(".", 1)[0])
        for name, method in src.methods(module, node).items():
            if _ACCESSOR.match(name):
                row = {"class": dotted, "name": name, "defined_in": method["defined_in"]}
                rows.append({**row, "scope": scope})
    return rows


def store_methods(src: HorovodSource) -> List[Dict]:
    """The public methods of every class of ``horovod.spark.common.store`` (with inherited)."""
    rows = []
    for name in module_names(src, STORE_MODULE):
        found = src.class_node(STORE_MODULE, name)
        if found is None:
            continue
        for method, entry in src.methods(*found).items():
            row = {"class": f"{STORE_MODULE}.{name}", "name": method, **entry}
            rows.append({**row, "scope": module_scope(STORE_MODULE)})
    return rows


def class_methods(src: HorovodSource, names: List[Dict]) -> List[Dict]:
    """The public methods of the other in-scope classes among ``names`` (each class once, under
    its first public path; Spark ``getX``/``setX`` accessors and store classes have their own
    sections)."""
    rows, seen = [], set()
    for entry in names:
        if entry["kind"] != "class" or entry["scope"]["owner"] != "issue19":
            continue
        module, name = entry["defined_in"].rsplit(".", 1)
        if entry["defined_in"] in seen or module == STORE_MODULE:
            continue
        seen.add(entry["defined_in"])
        for method, found in src.methods(*src.class_node(module, name)).items():
            if module.startswith("horovod.spark.") and _ACCESSOR.match(method):
                continue
            row = {"class": f"{entry['module']}.{entry['name']}", "name": method, **found}
            rows.append({**row, "scope": entry["scope"]})
    return rows


def internal_modules(src: HorovodSource) -> List[Dict]:
    """Horovod's other modules, with why each is not compared name by name."""
    rows = []
    for module in sorted(src.paths):
        if any(part.startswith("_") for part in module.split(".")):
            continue
        if ".test" in module or module in PUBLIC_MODULES:
            continue
        scope = module_scope(module)
        if scope["owner"] == "issue19":
            scope = {"owner": "internal", "reason": internal_reason(module)}
        rows.append({"module": module, "scope": scope})
    return rows


def extract(git_dir: str) -> Dict[str, Any]:
    """The whole data file's content."""
    src = HorovodSource(git_dir, TAG)
    names = public_names(src)
    return {
        "horovod_version": TAG.lstrip("v"),
        "source": f"git tag {TAG} of github.com/horovod/horovod, parsed with ast",
        "regenerate": "python dev/horovod_api/extract.py",
        "names": names,
        "methods": class_methods(src, names),
        "flags": flags(src),
        "estimator_params": estimator_params(src),
        "accessors": accessors(src),
        "store_methods": store_methods(src),
        "internal_modules": internal_modules(src),
    }


def to_json(data: Dict[str, Any]) -> str:
    """JSON with one entry of each list per line (small, and diffs show what changed)."""
    lines = ["{"]
    for index, (key, value) in enumerate(data.items()):
        comma = "," if index < len(data) - 1 else ""
        if isinstance(value, list):
            items = [f"  {json.dumps(item, sort_keys=True)}" for item in value]
            lines.append(f"{json.dumps(key)}: [\n" + ",\n".join(items) + f"\n]{comma}")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value)}{comma}")
    return "\n".join(lines) + "\n}\n"


def main(argv: List[str] | None = None) -> None:
    """Command line: ``--git-dir`` (Horovod's repository), ``--out`` (the data file)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", default=DEFAULT_GIT_DIR)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    data = extract(args.git_dir)
    Path(args.out).write_text(to_json(data))
    counts = {k: len(v) for k, v in data.items() if isinstance(v, list)}
    print(f"wrote {args.out}: {counts}")


if __name__ == "__main__":
    main()
