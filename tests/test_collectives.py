"""Every collective x dtype x op under kolorun, against a reference: 1, 2 and 3 ranks over TCP,
2 and 3 ranks over shared memory, two simulated hosts of two ranks (hierarchical), and a process
set of two of three ranks (its own shared memory, or TCP)."""

from __future__ import annotations

import re

import pytest

from conftest import output_tail, run_kolorun, worker

#: The data planes the matrix runs on: (ranks, environment). "hier" simulates two hosts of two
#: ranks each (shared memory within a host, TCP between the hosts' leaders).
LAYOUTS = {
    "tcp-1": (1, {"KOLO_TRANSPORT": "tcp"}),
    "tcp-2": (2, {"KOLO_TRANSPORT": "tcp"}),
    "tcp-3": (3, {"KOLO_TRANSPORT": "tcp"}),
    "shm-2": (2, {"KOLO_TRANSPORT": "shm", "KOLO_TEST_HUGE": "1"}),
    "shm-3": (3, {"KOLO_TRANSPORT": "shm", "KOLO_SHM_CHUNK_BYTES": "65536"}),
    "hier-2x2": (4, {"KOLO_TEST_RANKS_PER_HOST": "2", "KOLO_TEST_HUGE": "1"}),
    # A process set of two of three ranks on one host: shared memory of its own.
    "shm-set-of-3": (3, {"KOLO_TRANSPORT": "auto", "KOLO_TEST_SUBSET": "0,2"}),
    "tcp-set-of-3": (3, {"KOLO_TRANSPORT": "tcp", "KOLO_TEST_SUBSET": "2,0"}),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_collective_dtype_and_op_matches_reference(layout: str) -> None:
    ranks, env = LAYOUTS[layout]
    result = run_kolorun(
        ["-np", str(ranks), "python", worker("collectives_worker.py")], timeout=900, env=env
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    summaries = re.findall(
        r"\[(\d+)\]<stdout>:rank \d+ of (\d+): checked (\d+) cases, (\d+) failures", result.stdout
    )
    subset = env.get("KOLO_TEST_SUBSET")
    members = sorted(int(r) for r in subset.split(",")) if subset else list(range(ranks))
    assert sorted(int(rank) for rank, *_ in summaries) == members, result.stdout[-2000:]
    for _, size, checked, failed in summaries:
        assert int(size) == len(members)
        assert int(checked) > 800
        assert int(failed) == 0


def test_mismatched_calls_raise_on_every_rank() -> None:
    result = run_kolorun(["-np", "2", "python", worker("mismatch_worker.py")], timeout=120)
    assert result.returncode == 0, output_tail(result)
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:rank {rank}: 6 mismatches raised MismatchError" in result.stdout
        assert f"[{rank}]<stdout>:shape: MismatchError:" in result.stdout
    # The message names the ranks and what differs.
    shape_line = next(line for line in result.stdout.splitlines() if "shape: MismatchError" in line)
    assert "rank 0" in shape_line and "rank 1" in shape_line, shape_line
