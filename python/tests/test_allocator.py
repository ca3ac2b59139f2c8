"""``init()`` makes glibc keep freed memory for the next step (kolo._allocator): a 48 MiB block
(above glibc's adaptive mmap threshold, so by default mapped and unmapped every time) freed
and allocated again faults nothing once a rank has joined; the user's own settings and
``KOLO_MALLOC_TUNING=0`` keep glibc's defaults."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the tuning applies to glibc's malloc only"
)

# Joins as a single rank (no launcher), then mallocs, touches and frees a 48 MiB block three
# times (plain malloc: numpy would ask for huge pages) and prints the last two rounds' faults.
PROGRAM = """
import ctypes
import resource
from kolo._lifecycle import init, shutdown
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
init()
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(48 << 20)
    ctypes.memset(block, 1, 48 << 20)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
shutdown()
print(sum(faults[1:]))
"""


def faults_on_reuse(**env: str) -> int:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KOLO_", "MALLOC_"))}
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return int(result.stdout.split()[-1])


def test_a_rank_reuses_freed_blocks_without_page_faults() -> None:
    # 48 MiB is 12,288 pages: mapped afresh, each round faults them all in.
    assert faults_on_reuse() < 500
    assert faults_on_reuse(KOLO_MALLOC_TUNING="0") > 20_000


def test_the_users_malloc_settings_are_left_alone() -> None:
    assert faults_on_reuse(MALLOC_TRIM_THRESHOLD_="131072") > 20_000
