"""kolo's shared-memory segments in ``/dev/shm``, for tests that check a job left none behind.

The suite runs in two lanes at once (dev/test.sh, ``--lane``), so another test's job may be
setting its segments up at the moment a test looks. A rank unlinks its segment once every local
rank mapped it, so a segment still there with a live creator belongs to a job in its start-up;
one whose creator is dead was left behind. :func:`leftovers` reports only those.
"""

from __future__ import annotations

import time
from pathlib import Path

from support.processes import pid_alive

SHM_DIR = Path("/dev/shm")
#: The first bytes of a segment's header, then the creator's pid (bytes 8..12, little-endian).
SEGMENT_MAGIC = b"KOLOSHM1"


def segments(shm_dir: Path = SHM_DIR) -> set[str]:
    """The names of kolo's segments in ``shm_dir`` now."""
    return {p.name for p in shm_dir.glob("kolo-*")}


def creator_pid(segment: Path) -> int:
    """The pid in a segment's header, or -1 if it is gone or its header is not written yet."""
    try:
        with open(segment, "rb") as f:
            header = f.read(12)
    except FileNotFoundError:
        return -1
    return int.from_bytes(header[8:12], "little") if header[:8] == SEGMENT_MAGIC else -1


def leftovers(before: set[str], shm_dir: Path = SHM_DIR) -> list[str]:
    """The segments that appeared since ``before`` (from :func:`segments`) and that no live
    process is setting up: their creator is dead, or their header is still unwritten a second
    later (a creator writes it right after creating the file)."""
    new = [shm_dir / name for name in segments(shm_dir) - before]
    unwritten = [p for p in new if p.exists() and creator_pid(p) == -1]
    if unwritten:
        time.sleep(1.0)
    left = []
    for path in new:
        pid = creator_pid(path)
        if path.exists() and (pid == -1 or not pid_alive(pid)):
            left.append(path.name)
    return sorted(left)
