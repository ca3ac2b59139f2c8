"""horovodrun's options, read from ``horovod/runner/launch.py``'s ``add_argument`` calls.

Example::

    flags = launcher_flags(source_text)
    flags[0]["options"]        # ['-v', '--version']
"""

from __future__ import annotations

import ast
from typing import Any, Dict, List

#: Actions of launch.py that take no value on the command line (argparse ``nargs=0`` or the
#: ``make_override_{true,false}_action``/``make_deprecated_bool_action`` flag classes).
_FLAG_ACTIONS = (
    "store_true",
    "store_false",
    "version",
    "make_check_build_action",
    "make_override_true_action",
    "make_override_false_action",
    "make_deprecated_bool_action",
)

#: The argument group of the flags that configure elastic training (they act only on an
#: elastic command line).
ELASTIC_GROUP = "elastic arguments"


def launcher_flags(source: str) -> List[Dict[str, Any]]:
    """One entry per ``add_argument`` call of ``parse_args()`` with an option string:
    ``options``, ``dest``, ``action``, ``takes_value``, ``nargs``, ``type``, ``default``,
    ``group`` (the argument group's title) and ``hidden`` (help suppressed: deprecated)."""
    tree = ast.parse(source)
    parse_args = next(
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "parse_args"
    )
    groups: Dict[str, str] = {"parser": ""}
    flags: List[Dict[str, Any]] = []
    for stmt in parse_args.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
            _note_group(stmt, groups)
        call = stmt.value if isinstance(stmt, (ast.Assign, ast.Expr)) else None
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        if call.func.attr != "add_argument" or not isinstance(call.func.value, ast.Name):
            continue
        options = [ast.literal_eval(a) for a in call.args]
        if options[0].startswith("-"):
            flags.append(_flag(options, call, groups.get(call.func.value.id, "")))
    return flags


def _note_group(stmt: ast.Assign, groups: Dict[str, str]) -> None:
    call = stmt.value
    if not isinstance(call.func, ast.Attribute) or not isinstance(call.func.value, ast.Name):
        return
    target = stmt.targets[0]
    if not isinstance(target, ast.Name):
        return
    if call.func.attr == "add_argument_group":
        groups[target.id] = ast.literal_eval(call.args[0])
    elif call.func.attr == "add_mutually_exclusive_group":
        groups[target.id] = groups.get(call.func.value.id, "")


def _flag(options: List[str], call: ast.Call, group: str) -> Dict[str, Any]:
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    action = ast.unparse(keywords["action"]) if "action" in keywords else "store"
    action_name = action.strip("'\"").split("(")[0]
    nargs = ast.literal_eval(keywords["nargs"]) if "nargs" in keywords else None
    long_names = [o for o in options if o.startswith("--")]
    dest = (
        ast.literal_eval(keywords["dest"])
        if "dest" in keywords
        else (long_names[0] if long_names else options[0]).lstrip("-").replace("-", "_")
    )
    help_node = keywords.get("help")
    return {
        "options": options,
        "dest": dest,
        "action": action_name,
        "takes_value": nargs != 0 and action_name not in _FLAG_ACTIONS,
        "nargs": nargs,
        "type": ast.unparse(keywords["type"]) if "type" in keywords else None,
        "default": ast.unparse(keywords["default"]) if "default" in keywords else None,
        "group": group,
        "hidden": help_node is not None and ast.unparse(help_node) == "argparse.SUPPRESS",
    }
