"""glibc malloc settings for a training rank: keep freed memory for the next step.

By default glibc returns freed memory to the kernel (``mmap`` for blocks of 128 KiB and more
until its adaptive threshold rises, heap trimming above twice that), so a CPU training step
that frees its activations and gradients faults them in again, zeroed, at the next step. On
bench/training.py's small CNN (2 ranks, 2 cores) that was about 4,400 page faults and 6 ms of a
58 ms step, on every rank, with or without kolo's collectives. :func:`keep_freed_memory` sets
``M_MMAP_THRESHOLD`` to 64 MiB and ``M_TRIM_THRESHOLD`` to 256 MiB (as the environment
variables ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` would): blocks up to 64 MiB
come from the heap and up to 256 MiB of free heap is kept. ``init()`` calls it in every rank.

It does nothing when the C library is not glibc, when the user set either variable (glibc
already applied it), or with ``KOLO_MALLOC_TUNING=0``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

__all__ = ["keep_freed_memory"]

_log = logging.getLogger("kolo")

#: mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap (glibc's adaptive threshold stops at 32 MiB).
MMAP_THRESHOLD = 64 << 20
#: Free heap kept before glibc trims it.
TRIM_THRESHOLD = 256 << 20
#: The switch, and the glibc variables that mean the user chose already.
SWITCH = "KOLO_MALLOC_TUNING"
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def keep_freed_memory() -> bool:
    """Applies the settings above; True when it did.

    Example::

        from kolo._allocator import keep_freed_memory
        keep_freed_memory()   # False with KOLO_MALLOC_TUNING=0 or MALLOC_TRIM_THRESHOLD_ set
    """
    if os.environ.get(SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if any(name in os.environ for name in _USER_SETTINGS):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    applied = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and applied
    if not applied:
        _log.debug("glibc refused the malloc thresholds; its defaults stay")
    return applied
