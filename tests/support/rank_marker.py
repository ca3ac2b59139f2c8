"""Telling a test's rank processes apart from every other process on the machine: the test
puts ``KOLO_TEST_MARKER=<uuid>`` into the job's environment and finds the processes that carry
it.

Example::

    marker = uuid.uuid4().hex
    kolo.spark.run(fn, num_proc=2, env={MARKER_VAR: marker})
    assert_no_orphans(marker)
"""

from __future__ import annotations

import os
import time

MARKER_VAR = "KOLO_TEST_MARKER"


def marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries ``KOLO_TEST_MARKER=marker`` (the rank processes)."""
    needle = f"{MARKER_VAR}={marker}".encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read():
                    pids.append(int(name))
        except OSError:
            continue
    return pids


def assert_no_orphans(marker: str, within: float = 10.0) -> None:
    """Waits up to ``within`` seconds for the marked processes to be gone."""
    deadline = time.monotonic() + within
    while marked_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked_pids(marker) == [], "rank processes survived the job"


def interrupt_main_once_running(marker: str, ranks: int = 2) -> None:
    """From a daemon thread: once ``ranks`` marked processes run (at most 60 s) and half a
    second later, raises ``KeyboardInterrupt`` in the main thread (a Ctrl-C on the driver)."""
    import _thread
    import threading

    def interrupt() -> None:
        deadline = time.monotonic() + 60
        while len(marked_pids(marker)) < ranks and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        _thread.interrupt_main()

    threading.Thread(target=interrupt, daemon=True).start()
