"""When a rank process of ``kolo.spark.run`` passed each step of its start, sent to the driver.

The rank process records wall-clock (unix) times: when its process was created (from
``/proc/self/stat`` on Linux, else unknown), when its interpreter ran the first line of its
``-c`` program, when ``kolo`` was imported (``rank_main`` entered), when it joined the job
(every rank registered, rank variables set) and when the function was unpickled and about to
run. It sends them once, before the function runs, as a driver message that is JSON behind a
fixed prefix (never a pickle: the driver reads it without unpickling anything), and the
driver's launch report (:mod:`kolo.spark._launch_report`) turns them into the breakdown.

Example::

    data = encode_rank_times({"interpreter": 1.0, "kolo_imported": 1.1})
    assert decode_rank_times(data) == {"interpreter": 1.0, "kolo_imported": 1.1}
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Optional

#: What starts a launch-times message (a pickle starts with ``b"\\x80"``, so no user message
#: sent with ``send_to_driver`` can look like one).
PREFIX = b"\x00kolo-launch-times\x00"
#: The steps a rank reports, in the order it passes them.
RANK_STEPS = ("process", "interpreter", "kolo_imported", "joined", "payload_loaded")
#: Steps only some ranks pass: ``forked``, when a warm rank server forked the rank process
#: (after its client's interpreter started; a rank that reports it came from a warm server).
OPTIONAL_STEPS = ("forked",)
#: Every step a message may carry.
ALL_STEPS = (*RANK_STEPS, *OPTIONAL_STEPS)
#: The largest launch-times message the driver reads (a peer cannot make it parse more).
MAX_BYTES = 1024


def process_started_unix() -> Optional[float]:
    """The unix time this process was created (10 ms resolution), from ``/proc/self/stat``
    and ``CLOCK_BOOTTIME``; None where those do not exist.

    Example::

        started = process_started_unix()
    """
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22 (starttime); fields[0] is field 3
        boot_now = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.time() - (boot_now - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def encode_rank_times(times: dict[str, Optional[float]]) -> bytes:
    """The message a rank sends with its step times (only the known ones).

    Example::

        _native.session_send(encode_rank_times({"joined": time.time()}))
    """
    known = {step: float(times[step]) for step in ALL_STEPS if times.get(step) is not None}
    return PREFIX + json.dumps(known).encode()


def is_rank_times(data: bytes) -> bool:
    """Whether a driver message is a launch-times message (not a user's).

    Example::

        if is_rank_times(data): report.add_rank(rank, decode_rank_times(data))
    """
    return data.startswith(PREFIX)


def decode_rank_times(data: bytes) -> dict[str, float]:
    """The step times in a launch-times message; the steps it does not carry as finite
    numbers are left out (a malformed or oversized message gives ``{}``).

    Example::

        times = decode_rank_times(data)
    """
    if not is_rank_times(data) or len(data) > MAX_BYTES:
        return {}
    try:
        raw = json.loads(data[len(PREFIX) :])
    except ValueError:
        return {}
    if not isinstance(raw, dict):
        return {}
    times = {}
    for step in ALL_STEPS:
        value = raw.get(step)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                times[step] = float(value)
    return times
