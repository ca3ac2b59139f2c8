"""The rank process of :func:`kolo.spark.run_elastic`: wait to be admitted to the elastic job,
then run the function like :func:`kolo.spark.run`'s ranks (:mod:`kolo._rank_process`).

A Spark task attempt that is not one of the job's first tasks starts its rank process before
the driver has admitted it (the driver learns of the attempt from the task's start report):
joining is refused as "not a live task" until then, so this process retries, for at most its
start timeout (``KOLO_START_TIMEOUT``). A task the job never has room for ends there.
"""

from __future__ import annotations

import os
import time

from kolo._rank_process import rank_main

#: What the job driver answers a task it has not admitted (driver_state.rs, register_elastic).
NOT_ADMITTED = "is not a live task of this elastic job"
#: Default of the admission wait when ``KOLO_START_TIMEOUT`` is unset.
DEFAULT_ADMISSION_WAIT_S = 600.0
FIRST_RETRY_S = 0.05
MAX_RETRY_S = 0.5


def join_when_admitted() -> list[tuple[str, str]]:
    """``kolo._native.session_join``, retried while the driver has not admitted this task."""
    from kolo import _native
    from kolo.exceptions import RendezvousError

    try:
        wait = float(os.environ.get("KOLO_START_TIMEOUT", DEFAULT_ADMISSION_WAIT_S))
    except ValueError:
        wait = DEFAULT_ADMISSION_WAIT_S
    deadline = time.monotonic() + wait
    delay = FIRST_RETRY_S
    while True:
        try:
            return _native.session_join()
        except RendezvousError as err:
            if NOT_ADMITTED not in str(err):
                raise
            if time.monotonic() + delay > deadline:
                raise RendezvousError(
                    f"task {os.environ.get('KOLO_TASK_INDEX')} was not admitted to the elastic "
                    f"job within {wait:.0f} s (max_num_proc ranks were running): {err}"
                ) from err
        time.sleep(delay)
        delay = min(delay * 2, MAX_RETRY_S)


def main() -> None:
    """Entry point of ``python -c`` in a ``run_elastic`` task."""
    rank_main("kolo.spark.run_elastic", join=join_when_admitted)
