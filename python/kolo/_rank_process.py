"""The rank process of a job that ships a Python function to its ranks (``kolo.run`` and
``kolo.spark.run``): join the job, run the function, return its result or report its failure.

The launcher starts ``python -c rank_code("kolo.run")``; the pickled function and its result
travel through the job's authenticated driver service (never a file or a command line).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable, Optional

#: How long a rank process waits for its function (published before any rank starts, or
#: once every rank registered).
PAYLOAD_TIMEOUT_S = 120.0


def rank_code(launcher: str) -> str:
    """The ``python -c`` program of a rank process of ``launcher`` (named in its messages).

    Example::

        rank_code("kolo.run")   # 'from kolo._rank_process import rank_main; ...'
    """
    return f"from kolo._rank_process import rank_main; rank_main({launcher!r})"


def rank_main(launcher: str, join: Optional[Callable[[], list[tuple[str, str]]]] = None) -> None:
    """A rank process: join the job (the rank variables go into ``os.environ`` before the
    function is unpickled), run the function, return its result or report its failure (its
    traceback on stderr and to the driver, exit status 1). ``join`` replaces
    ``kolo._native.session_join`` (``kolo.spark.run_elastic`` waits there to be admitted)."""
    from kolo import _native

    try:
        for name, value in (join or _native.session_join)():
            os.environ[name] = value
    except BaseException as err:
        print(f"{launcher}: the rank process could not join its job: {err}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    try:
        import cloudpickle

        func, args, kwargs = cloudpickle.loads(_native.session_payload(PAYLOAD_TIMEOUT_S))
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
