"""The rank process of a job that ships a Python function to its ranks (``kolo.run`` and
``kolo.spark.run``): join the job, run the function, return its result or report its failure.

The launcher starts ``python -c rank_code("kolo.run")``; the pickled function and its result
travel through the job's authenticated driver service (never a file or a command line).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from typing import Callable, Optional

from kolo._launch_times import encode_rank_times, process_started_unix

#: How long a rank process waits for its function (published before any rank starts, or
#: once every rank registered).
PAYLOAD_TIMEOUT_S = 120.0


def rank_code(launcher: str, report_times: bool = False, record_modules: bool = False) -> str:
    """The ``python -c`` program of a rank process of ``launcher`` (named in its messages);
    with ``report_times`` the rank sends the driver when it passed each step of its start
    (:mod:`kolo._launch_times`), its first line being the interpreter's start; with
    ``record_modules`` the program takes one argument, a path where the rank writes the
    installed modules it imported (:func:`write_third_party_modules`) after its function
    succeeded (``sys.argv`` is ``["-c"]`` again before the function runs).

    Example::

        rank_code("kolo.run")   # 'from kolo._rank_process import rank_main; ...'
    """
    if not report_times:
        return f"from kolo._rank_process import rank_main; rank_main({launcher!r})"
    modules = ", modules_out=sys.argv.pop(1) if len(sys.argv) > 1 else None"
    return (
        "import time; _kolo_started = time.time(); "
        + ("import sys; " if record_modules else "")
        + "from kolo._rank_process import rank_main; "
        f"rank_main({launcher!r}, interpreter_unix=_kolo_started"
        + (modules if record_modules else "")
        + ")"
    )


def rank_main(
    launcher: str,
    join: Optional[Callable[[], list[tuple[str, str]]]] = None,
    interpreter_unix: Optional[float] = None,
    start_times: Optional[dict[str, Optional[float]]] = None,
    modules_out: Optional[str] = None,
) -> None:
    """A rank process: join the job (the rank variables go into ``os.environ`` before the
    function is unpickled), run the function, return its result or report its failure (its
    traceback on stderr and to the driver, exit status 1). ``join`` replaces
    ``kolo._native.session_join`` (``kolo.spark.run_elastic`` waits there to be admitted).
    With ``interpreter_unix`` (when the interpreter started the program), the rank sends the
    driver its start steps' times just before the function runs; ``start_times`` replaces
    the measured ones (a rank forked by a warm rank server passes when its client process
    started and when it was forked). With ``modules_out``, the installed modules the rank
    imported are written there once its function succeeded (a failure to write is logged)."""
    times: dict[str, Optional[float]] = {"interpreter": interpreter_unix}
    if interpreter_unix is not None:
        times["kolo_imported"] = time.time()
        times["process"] = process_started_unix()
        times.update(start_times or {})
    from kolo import _native

    try:
        for name, value in (join or _native.session_join)():
            os.environ[name] = value
    except BaseException as err:
        print(f"{launcher}: the rank process could not join its job: {err}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    times["joined"] = time.time()
    try:
        import cloudpickle

        func, args, kwargs = cloudpickle.loads(_native.session_payload(PAYLOAD_TIMEOUT_S))
        if interpreter_unix is not None:
            times["payload_loaded"] = time.time()
            _send_times(_native, times)
        data = cloudpickle.dumps(func(*args, **kwargs))
    except BaseException:
        text = traceback.format_exc()
        sys.stderr.write(text)
        sys.stderr.flush()
        try:
            _native.session_fail(text)
        finally:
            sys.stdout.flush()
            sys.exit(1)
    if modules_out is not None:
        write_third_party_modules(modules_out)
    _native.session_put_result(data)
    _native.session_finish()
    sys.stdout.flush()
    sys.stderr.flush()


def _send_times(native: object, times: dict[str, Optional[float]]) -> None:
    """Sends the start steps' times; a failure only costs the driver its breakdown."""
    try:
        native.session_send(encode_rank_times(times))  # type: ignore[attr-defined]
    except Exception as err:
        logging.getLogger("kolo").debug("could not send the launch times: %s", err)


def third_party_modules() -> list[str]:
    """The modules this process imported that a warm rank server may import ahead of a later
    rank, in the order they were imported: the top-level modules imported from an installed
    location (a site-packages or dist-packages directory of this interpreter, even one inside
    the working directory, as in ``project/.venv``), never the user's own code from the working
    directory or anywhere else on ``sys.path`` (it may be edited between runs); and kolo's own
    modules.

    Example::

        third_party_modules()   # ['cloudpickle', 'numpy', 'torch', 'kolo.torch']
    """
    import site
    import sysconfig

    roots = set()
    for root in [*site.getsitepackages(), site.getusersitepackages()]:
        roots.add(os.path.realpath(root))
    for name in ("purelib", "platlib"):
        roots.add(os.path.realpath(sysconfig.get_paths()[name]))
    roots = {root for root in roots if os.path.basename(root) in ("site-packages", "dist-packages")}
    cwd = os.path.realpath(os.getcwd())
    # Code in the working directory is the user's, unless the working directory is itself inside
    # an installed location (a virtualenv inside the project is common: its packages still count).
    cwd_is_installed = any(cwd == root or cwd.startswith(root + os.sep) for root in roots)
    names = []
    for name, module in list(sys.modules.items()):
        if name.startswith("kolo."):
            names.append(name)
            continue
        if "." in name or name in ("__main__", "kolo"):
            continue
        path = getattr(module, "__file__", None)
        if not isinstance(path, str):
            continue
        path = os.path.realpath(path)
        if not any(path.startswith(root + os.sep) for root in roots):
            continue
        if cwd_is_installed and path.startswith(cwd + os.sep):
            continue
        names.append(name)
    return names


def write_third_party_modules(path: str) -> None:
    """Writes :func:`third_party_modules` to ``path`` as JSON (atomically, 0600)."""
    try:
        import json

        temp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            json.dump(third_party_modules(), file)
        os.replace(temp, path)
    except (OSError, ValueError) as err:
        logging.getLogger("kolo").debug("could not record the imported modules: %s", err)
