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


def rank_code(launcher: str, report_times: bool = False) -> str:
    """The ``python -c`` program of a rank process of ``launcher`` (named in its messages);
    with ``report_times`` the rank sends the driver when it passed each step of its start
    (:mod:`kolo._launch_times`), its first line being the interpreter's start.

    Example::

        rank_code("kolo.run")   # 'from kolo._rank_process import rank_main; ...'
    """
    if not report_times:
        return f"from kolo._rank_process import rank_main; rank_main({launcher!r})"
    return (
        "import time; _kolo_started = time.time(); "
        "from kolo._rank_process import rank_main; "
        f"rank_main({launcher!r}, interpreter_unix=_kolo_started)"
    )


def rank_main(
    launcher: str,
    join: Optional[Callable[[], list[tuple[str, str]]]] = None,
    interpreter_unix: Optional[float] = None,
) -> None:
    """A rank process: join the job (the rank variables go into ``os.environ`` before the
    function is unpickled), run the function, return its result or report its failure (its
    traceback on stderr and to the driver, exit status 1). ``join`` replaces
    ``kolo._native.session_join`` (``kolo.spark.run_elastic`` waits there to be admitted).
    With ``interpreter_unix`` (when the interpreter started the program), the rank sends the
    driver its start steps' times just before the function runs."""
    times: dict[str, Optional[float]] = {"interpreter": interpreter_unix}
    if interpreter_unix is not None:
        times["kolo_imported"] = time.time()
        times["process"] = process_started_unix()
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
