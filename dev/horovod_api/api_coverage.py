"""How much of Horovod's API (the data file written by ``extract.py``) kolo covers.

Every entry of the data file becomes one or more :class:`Check` rows: a Horovod name (present
in kolo under the same path with ``horovod`` → ``kolo``), its signature (compatible: every
Horovod parameter exists in kolo's with the same name, positional ones in the same order, no
new required ones), a method of a class (present, compatible), a horovodrun flag
(``kolo.runner.parse_args`` accepts every spelling; with effect when it gives no notice), an
estimator parameter (the kolo class accepts it; with effect
when ``kolo.estimator.params.NO_EFFECT`` does not list it), an accessor, a store method. Only
in-scope entries (``scope.owner == "issue19"``) are checked against kolo; the others carry
their owner and reason.

Example::

    checks = run_checks(load_data())
    counts(checks)["name"]       # (covered, total)
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[2]
DATA_FILE = REPO / "python" / "tests" / "fixtures" / "horovod_api_0.28.1.json"
GAPS_FILE = REPO / "python" / "tests" / "fixtures" / "horovod_api_gaps.txt"
IN_SCOPE = "issue19"
#: horovodrun's argument group of the elastic flags (launcher_flags.ELASTIC_GROUP).
ELASTIC_GROUP = "elastic arguments"

#: Check categories, in the order the figure lists them, with their label.
CATEGORIES: Dict[str, str] = {
    "name": "names present",
    "signature": "signatures compatible",
    "method": "methods of those classes (present, compatible signature)",
    "flag": "horovodrun flags accepted",
    "flag-effect": "horovodrun flags with Horovod's effect (no notice)",
    "param": "estimator constructor parameters accepted",
    "param-effect": "estimator constructor parameters with an effect",
    "accessor": "estimator getters/setters",
    "store-method": "store methods (present, compatible signature)",
}

#: Categories that must all be covered; the ``-effect`` ones must reach :data:`EFFECT_TARGET`.
ACCEPTANCE = ("name", "signature", "method", "flag", "param", "accessor", "store-method")
EFFECT_TARGET = 0.98

_MISSING = object()


@dataclass(frozen=True)
class Check:
    """One checked item: ``category``, Horovod's ``id``, kolo's ``kolo`` path, ``owner``
    (``"issue19"`` or who owns it), ``covered``, and ``detail`` (why not, or the difference
    kolo documents)."""

    category: str
    id: str
    kolo: str
    owner: str
    covered: bool
    detail: str = ""

    @property
    def key(self) -> str:
        """The line of this check in the gap list."""
        return f"{self.category} {self.id}"


def load_data(path: Path = DATA_FILE) -> Dict[str, Any]:
    """The data file written by ``dev/horovod_api/extract.py``."""
    return json.loads(path.read_text())


def kolo_path(horovod_path: str) -> str:
    """``horovod.torch.allreduce`` → ``kolo.torch.allreduce``."""
    assert horovod_path == "horovod" or horovod_path.startswith("horovod."), horovod_path
    return "kolo" + horovod_path[len("horovod") :]


def lookup(path: str) -> Any:
    """The object at the dotted ``path`` (the longest importable module, then attributes),
    or ``_MISSING``; errors raised while importing an existing kolo module propagate."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and module_name.startswith(err.name) and err.name.startswith("kolo"):
                continue
            raise
        for attr in parts[cut:]:
            obj = getattr(obj, attr, _MISSING)
            if obj is _MISSING:
                return _MISSING
        return obj
    return _MISSING


# -- signatures ------------------------------------------------------------------------------

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VAR = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def signature_problem(
    horovod: List[Dict[str, Any]],
    kolo: inspect.Signature,
    accepts_keyword: Optional[Callable[[str], bool]] = None,
) -> str:
    """Why a call written for Horovod's parameters ``horovod`` could fail against ``kolo``
    ("" when none): a parameter missing or at another position, optional in Horovod but
    required in kolo, ``*args``/``**kwargs`` missing, or a new required parameter.
    ``accepts_keyword(name)`` says whether kolo's ``**kwargs`` really takes ``name`` (Spark
    ML ``Params`` classes); otherwise ``**kwargs`` does not stand for a named parameter."""
    params = list(kolo.parameters.values())
    positional = [p for p in params if p.kind in _POSITIONAL]
    by_name = {p.name: p for p in params if p.kind not in _VAR}
    kinds = {p.kind for p in params}
    problems: List[str] = []
    misplaced = set()
    h_positional = [p for p in horovod if p["kind"] in ("positional_only", "positional_or_keyword")]
    for index, hp in enumerate(h_positional):
        kp = positional[index] if index < len(positional) else None
        if kp is None or (kp.name != hp["name"] and hp["kind"] != "positional_only"):
            where = f"`{kp.name}`" if kp is not None else "nothing"
            problems.append(f"positional {index + 1} is `{hp['name']}` (kolo: {where})")
            misplaced.add(kp.name if kp is not None else "")
            continue
        if hp["kind"] == "positional_or_keyword" and kp.kind is inspect.Parameter.POSITIONAL_ONLY:
            problems.append(f"`{hp['name']}` cannot be given by keyword")
        if "default" in hp and kp.default is inspect.Parameter.empty:
            problems.append(f"`{hp['name']}` is required (optional in Horovod)")
    for hp in horovod:
        if hp["kind"] == "keyword_only":
            kp = by_name.get(hp["name"])
            if kp is None or kp.kind is inspect.Parameter.POSITIONAL_ONLY:
                if accepts_keyword is None or not accepts_keyword(hp["name"]):
                    problems.append(f"no `{hp['name']}=`")
            elif "default" in hp and kp.default is inspect.Parameter.empty:
                problems.append(f"`{hp['name']}` is required (optional in Horovod)")
    horovod_names = {p["name"] for p in horovod}
    h_kinds = {p["kind"] for p in horovod}
    extras = [p for p in params if p.name not in horovod_names and p.kind not in _VAR]
    if "var_positional" in h_kinds and inspect.Parameter.VAR_POSITIONAL not in kinds:
        if len(positional) <= len(h_positional):
            problems.append("no `*args` (Horovod forwards extra positional arguments)")
    if "var_keyword" in h_kinds and inspect.Parameter.VAR_KEYWORD not in kinds and not extras:
        problems.append("no `**kwargs` (Horovod forwards extra keyword arguments)")
    for kp in extras:
        if kp.default is not inspect.Parameter.empty or kp.name in misplaced:
            continue
        # Horovod's *args/**kwargs forward to a parameter kolo names instead
        if kp.kind in _POSITIONAL and "var_positional" in h_kinds:
            continue
        if kp.kind is not inspect.Parameter.POSITIONAL_ONLY and "var_keyword" in h_kinds:
            continue
        problems.append(f"kolo requires `{kp.name}`")
    return "; ".join(problems)


def spark_params_acceptor(cls: Any) -> Optional[Callable[[str], bool]]:
    """For a Spark ML ``Params`` class whose constructor takes ``**kwargs``: a test of
    whether it declares a parameter (what ``setParams`` accepts)."""
    try:
        from pyspark.ml.param import Param
    except ImportError:
        return None
    if not isinstance(cls, type):
        return None
    return lambda name: isinstance(getattr(cls, name, None), Param)


def _callable_signature(obj: Any) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def _method_signature(cls: Any, name: str, kind: str) -> Optional[inspect.Signature]:
    raw = inspect.getattr_static(cls, name, None)
    if isinstance(raw, property) or raw is None:
        return None
    sig = _callable_signature(getattr(cls, name))
    if sig is None:
        return None
    if isinstance(raw, (staticmethod, classmethod)) or kind == "staticmethod":
        return sig
    params = list(sig.parameters.values())
    return sig.replace(parameters=params[1:])


# -- checks ----------------------------------------------------------------------------------


def _scope_text(scope: Dict[str, str]) -> str:
    reason = scope.get("reason", "")
    return f"{scope['owner']}: {reason}" if reason else scope["owner"]


def name_checks(entry: Dict[str, Any]) -> List[Check]:
    """``name`` (and ``signature``, for functions and classes) checks of one name."""
    horovod = f"{entry['module']}.{entry['name']}"
    kolo = kolo_path(horovod)
    owner = entry["scope"]["owner"]
    has_signature = entry["kind"] in ("function", "class") and entry.get("signature") is not None
    if owner != IN_SCOPE:
        text = _scope_text(entry["scope"])
        rows = [Check("name", horovod, kolo, owner, False, text)]
        if has_signature:
            rows.append(Check("signature", horovod, kolo, owner, False, text))
        return rows
    obj = lookup(kolo)
    present = obj is not _MISSING
    rows = [Check("name", horovod, kolo, owner, present, "" if present else "missing")]
    if not has_signature:
        return rows
    if not present:
        return [*rows, Check("signature", horovod, kolo, owner, False, "missing")]
    sig = _callable_signature(obj)
    if sig is None:
        problem = "kolo's object has no inspectable signature"
    else:
        accepts = spark_params_acceptor(obj) if entry["kind"] == "class" else None
        problem = signature_problem(entry["signature"], sig, accepts)
    return [*rows, Check("signature", horovod, kolo, owner, not problem, problem)]


def _sample_files(folder: str) -> Dict[str, str]:
    """Files in ``folder`` for the flags that name one: a hostfile, a discovery script, a
    config file, an identity file (and paths for the outputs)."""
    files = {
        "hostfile": ("localhost slots=2\n", 0o600),
        "host_discovery_script": ("#!/bin/sh\necho localhost:2\n", 0o700),
        "config_file": ("params:\n  fusion_threshold_mb: 32\n", 0o600),
        "ssh_identity_file": ("", 0o600),
    }
    paths = {}
    for dest, (text, mode) in files.items():
        path = os.path.join(folder, dest)
        with open(path, "w") as handle:
            handle.write(text)
        os.chmod(path, mode)
        paths[dest] = path
    paths["output_filename"] = os.path.join(folder, "logs")
    paths["timeline_filename"] = os.path.join(folder, "timeline.json")
    paths["autotune_log_file"] = os.path.join(folder, "autotune.csv")
    return paths


_SAMPLE_VALUES = {
    "hosts": ["localhost:2"],
    "nics": ["lo"],
    "log_level": ["INFO"],
    "cooldown_range": ["1", "10"],
    "autotune_gaussian_process_noise": ["0.8"],
}


def sample_argv(flag: Dict[str, Any], option: str, files: Dict[str, str]) -> List[str]:
    """A valid horovodrun command line using ``option`` (one spelling of ``flag``); an
    elastic flag's line is elastic (``--min-np 1``), as the flag only acts there."""
    tail = ["python", "train.py"]
    if flag["group"] == ELASTIC_GROUP and flag["dest"] != "min_np":
        tail = ["--min-np", "1", *tail]
    if not flag["takes_value"]:
        return ["-np", "2", option, *tail]
    dest = flag["dest"]
    if dest in ("mpi_args", "binding_args"):
        return ["-np", "2", f"{option}=--bind-to none", *tail]
    if dest in files:
        values = [files[dest]]
    elif dest in _SAMPLE_VALUES:
        values = _SAMPLE_VALUES[dest]
    else:
        values = {"int": ["2"], "float": ["1.5"]}.get(flag["type"] or "", ["2"])
    prefix = [] if dest == "num_proc" else ["-np", "2"]
    return [*prefix, option, *values, *tail]


def flag_checks(flags: List[Dict[str, Any]]) -> List[Check]:
    """``flag`` and ``flag-effect`` checks through ``kolo.runner.parse_args``."""
    runner = lookup("kolo.runner")
    parse_args = getattr(runner, "parse_args", None) if runner is not _MISSING else None
    with tempfile.TemporaryDirectory(prefix="kolo-horovod-api-") as folder:
        files = _sample_files(folder)
        return [row for flag in flags for row in _flag_checks(flag, parse_args, files, folder)]


def _flag_checks(
    flag: Dict[str, Any], parse_args: Any, files: Dict[str, str], folder: str
) -> List[Check]:
    spelled = "/".join(flag["options"])
    owner = flag["scope"]["owner"]
    problems, notices = [], []
    if parse_args is None:
        problems.append("kolo.runner.parse_args is missing")
    for option in flag["options"] if parse_args is not None else []:
        try:
            parsed = parse_args(sample_argv(flag, option, files))
        except lookup("kolo.exceptions.KoloError") as err:
            problems.append(f"`{option}`: {type(err).__name__}: {err}")
            continue
        except SystemExit as exit_:
            if exit_.code not in (0, None):
                problems.append(f"`{option}` exits {exit_.code}")
            continue
        for noticed, text in parsed.get("notices", []):
            text = text.replace(folder, "<tmp>")
            if noticed in flag["options"] and text not in notices:
                notices.append(text)
    accepted = not problems
    rows = [Check("flag", spelled, "kolorun", owner, accepted, "; ".join(problems))]
    if "effect_owner" in flag:
        detail = f"effect: {flag['effect_owner']}"
        return [
            *rows,
            Check("flag-effect", spelled, "kolorun", flag["effect_owner"], False, detail),
        ]
    detail = "; ".join(notices) if accepted else "not accepted"
    return [
        *rows,
        Check("flag-effect", spelled, "kolorun", owner, accepted and not notices, detail),
    ]


def _no_effect() -> Optional[Dict[str, str]]:
    params = lookup("kolo.estimator.params")
    return None if params is _MISSING else getattr(params, "NO_EFFECT", None)


def param_checks(params: List[Dict[str, Any]]) -> List[Check]:
    """``param`` and ``param-effect`` checks of the estimators' constructor parameters."""
    no_effect = _no_effect()
    rows = []
    for param in params:
        ident = f"{param['class']}({param['name']}=)"
        kolo = kolo_path(param["class"])
        owner = param["scope"]["owner"]
        if owner != IN_SCOPE:
            text = _scope_text(param["scope"])
            rows += [Check(c, ident, kolo, owner, False, text) for c in ("param", "param-effect")]
            continue
        cls = lookup(kolo)
        problem = "class missing" if cls is _MISSING else _param_problem(cls, param)
        rows.append(Check("param", ident, kolo, owner, not problem, problem))
        if problem:
            effect, detail = False, "not accepted"
        elif no_effect is None:
            effect, detail = False, "kolo.estimator.params.NO_EFFECT is missing"
        else:
            effect = param["name"] not in no_effect
            detail = "" if effect else no_effect[param["name"]]
        rows.append(Check("param-effect", ident, kolo, owner, effect, detail))
    return rows


def _param_problem(cls: Any, param: Dict[str, Any]) -> str:
    sig = _callable_signature(cls)
    if sig is None:
        return "kolo's constructor has no inspectable signature"
    one = [{k: v for k, v in param.items() if k in ("name", "kind", "default")}]
    one[0]["kind"] = "keyword_only"
    return signature_problem(one, sig, spark_params_acceptor(cls)).split(";")[0]


def accessor_checks(accessors: List[Dict[str, Any]]) -> List[Check]:
    """``accessor`` checks: kolo's class has the ``getX``/``setX`` method."""
    rows = []
    for accessor in accessors:
        ident = f"{accessor['class']}.{accessor['name']}"
        kolo = kolo_path(accessor["class"])
        owner = accessor["scope"]["owner"]
        if owner != IN_SCOPE:
            rows.append(
                Check("accessor", ident, kolo, owner, False, _scope_text(accessor["scope"]))
            )
            continue
        cls = lookup(kolo)
        found = cls is not _MISSING and callable(getattr(cls, accessor["name"], None))
        rows.append(Check("accessor", ident, kolo, owner, found, "" if found else "missing"))
    return rows


def method_checks(methods: List[Dict[str, Any]], category: str) -> List[Check]:
    """``method``/``store-method`` checks: present on kolo's class with a compatible
    signature."""
    rows = []
    for method in methods:
        ident = f"{method['class']}.{method['name']}"
        kolo = kolo_path(method["class"])
        owner = method["scope"]["owner"]
        if owner != IN_SCOPE:
            rows.append(Check(category, ident, kolo, owner, False, _scope_text(method["scope"])))
            continue
        cls = lookup(kolo)
        if cls is _MISSING:
            problem = "class missing"
        elif inspect.getattr_static(cls, method["name"], _MISSING) is _MISSING:
            problem = "missing"
        elif method["kind"] == "property":
            problem = ""
        else:
            sig = _method_signature(cls, method["name"], method["kind"])
            problem = (
                "kolo's method has no inspectable signature"
                if sig is None
                else signature_problem(method["signature"], sig)
            )
        rows.append(Check(category, ident, kolo, owner, not problem, problem))
    return rows


def run_checks(data: Dict[str, Any]) -> List[Check]:
    """Every check of the data file against the kolo importable here."""
    rows: List[Check] = []
    for entry in data["names"]:
        rows += name_checks(entry)
    rows += flag_checks(data["flags"])
    rows += param_checks(data["estimator_params"])
    rows += accessor_checks(data["accessors"])
    rows += method_checks(data["methods"], "method")
    rows += method_checks(data["store_methods"], "store-method")
    return rows


def counts(checks: List[Check]) -> Dict[str, Tuple[int, int]]:
    """``{category: (covered, total)}`` over the in-scope checks."""
    result = {}
    for category in CATEGORIES:
        rows = [c for c in checks if c.category == category and c.owner == IN_SCOPE]
        result[category] = (sum(c.covered for c in rows), len(rows))
    return result


def figure(checks: List[Check]) -> List[str]:
    """The coverage figure, one line per category: ``label: covered / total (percent)``."""
    lines = []
    for category, (covered, total) in counts(checks).items():
        share = f"{100 * covered / total:.1f} %" if total else "-"
        lines.append(f"{CATEGORIES[category]}: {covered} / {total} ({share})")
    return lines


def gaps(checks: List[Check]) -> List[str]:
    """The gap list: keys of the in-scope checks kolo does not cover, sorted."""
    return sorted(c.key for c in checks if c.owner == IN_SCOPE and not c.covered)


def read_gap_file(path: Path = GAPS_FILE) -> List[str]:
    """The committed gap list (comment lines start with ``#``)."""
    lines = path.read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]
