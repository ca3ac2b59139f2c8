"""Fail-fast: a rank SIGKILLed inside an allreduce stops the job quickly and leaves no process,
over TCP and over shared memory (where it also leaves no segment in /dev/shm)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from conftest import kill_quietly, pid_alive, run_kolorun, worker


def kolo_segments() -> set[str]:
    """kolo's shared-memory segments currently in /dev/shm."""
    return {p.name for p in Path("/dev/shm").glob("kolo-*")}


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_sigkill_mid_allreduce_makes_others_raise_and_kolorun_fail(tmp_path, transport) -> None:
    segments_before = kolo_segments()
    started = time.monotonic()
    result = run_kolorun(
        ["-np", "3", "python", worker("sigkill_worker.py"), str(tmp_path)],
        timeout=120,
        env={"KOLO_TRANSPORT": transport},
    )
    elapsed = time.monotonic() - started
    segments_after = kolo_segments()
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    try:
        assert result.returncode != 0, result.stdout + result.stderr
        assert elapsed < 60, f"kolorun took {elapsed:.1f} s"
        # kolorun's summary names the dead rank and how it died.
        assert re.search(r"rank 1 .*SIGKILL", result.stderr), result.stderr[-3000:]
        killed_at = float(re.search(r"rank 1 SIGKILLs itself at ([\d.]+)", result.stdout).group(1))
        for rank in (0, 2):
            match = re.search(
                rf"\[{rank}\]<stdout>:rank {rank} raised (\w+) at ([\d.]+): (.*)", result.stdout
            )
            assert match, f"rank {rank} did not raise:\n{result.stdout[-3000:]}"
            error_name, raised_at, message = match.group(1), float(match.group(2)), match.group(3)
            assert error_name in ("JobAbortedError", "PeerConnectionError"), error_name
            assert raised_at - killed_at < 10, (
                f"rank {rank} raised {raised_at - killed_at:.1f} s late"
            )
            assert "rank 1" in message, message
        assert segments_after <= segments_before, (
            f"left in /dev/shm: {sorted(segments_after - segments_before)}"
        )
        assert len(pids) == 3
        assert not [pid for pid in pids if pid_alive(pid)], "a rank process survived kolorun"
    finally:
        for pid in pids:
            kill_quietly(pid)
