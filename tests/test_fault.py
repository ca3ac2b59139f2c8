"""Fail-fast: a rank SIGKILLed inside an allreduce stops the job quickly and leaves no process,
over TCP and over shared memory (where it also leaves no segment in /dev/shm)."""

from __future__ import annotations

import re
import time

import pytest
from support.shm_segments import leftovers, segments

from conftest import kill_quietly, pid_alive, run_kolorun, worker


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_sigkill_mid_allreduce_makes_others_raise_and_kolorun_fail(tmp_path, transport) -> None:
    segments_before = segments()
    started = time.monotonic()
    result = run_kolorun(
        ["-np", "3", "python", worker("sigkill_worker.py"), str(tmp_path)],
        timeout=120,
        env={"KOLO_TRANSPORT": transport},
    )
    elapsed = time.monotonic() - started
    left = leftovers(segments_before)
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
        assert not left, f"left in /dev/shm: {left}"
        assert len(pids) == 3
        assert not [pid for pid in pids if pid_alive(pid)], "a rank process survived kolorun"
    finally:
        for pid in pids:
            kill_quietly(pid)


def test_a_frozen_rank_is_named_by_every_survivors_timeout(tmp_path) -> None:
    """Rank 2 (host simhost2) freezes mid-allreduce: with heartbeats slower than the collective
    timeout the data plane times out first, and rank 1, which waits on rank 0 (itself blocked
    behind rank 2), must still name rank 2 and its host as the one the driver lost."""
    started = time.monotonic()
    try:
        result = run_kolorun(
            ["-np", "3", "python", worker("stopped_rank_worker.py"), str(tmp_path)],
            timeout=90,
            env={
                "KOLO_TRANSPORT": "tcp",
                "KOLO_COLLECTIVE_TIMEOUT_SECONDS": "3",
                "KOLO_HEARTBEAT_TIMEOUT_SECONDS": "60",
                "KOLO_ABORT_GRACE_SECONDS": "1",
            },
        )
    finally:
        pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
        for pid in pids:
            kill_quietly(pid)
    elapsed = time.monotonic() - started
    assert result.returncode != 0, result.stdout + result.stderr
    stopped_at = float(re.search(r"rank 2 SIGSTOPs itself at ([\d.]+)", result.stdout).group(1))
    raised = []
    for rank in (0, 1):
        match = re.search(
            rf"\[{rank}\]<stdout>:rank {rank} raised (\w+) at ([\d.]+): (.*)", result.stdout
        )
        assert match, f"rank {rank} did not raise:\n{result.stdout[-3000:]}"
        error_name, raised_at, message = match.group(1), float(match.group(2)), match.group(3)
        raised.append(error_name)
        assert raised_at - stopped_at < 3 + 8, (
            f"rank {rank} raised {raised_at - stopped_at:.1f} s late"
        )
        assert re.search(
            r"the job driver has not heard from rank 2 on host simhost2 \(127\.0\.0\.1\) "
            r"for [\d.]+ s: it is probably unreachable",
            message,
        ), f"rank {rank}: {message}"
    # The data plane timed out first. Both ranks' timeouts fire about together: the first
    # rank to exit (with 3) makes the driver abort the job, so the other may get that abort
    # (JobAbortedError, naming rank 2 the same way) just before its own timeout.
    assert set(raised) <= {"TimeoutError", "PeerConnectionError", "JobAbortedError"}, raised
    assert set(raised) - {"JobAbortedError"}, f"no rank's collective timed out: {raised}"
    assert elapsed < 60, f"kolorun took {elapsed:.1f} s"
