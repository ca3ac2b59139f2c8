"""The shared-memory transport's contract: chosen by KOLO_TRANSPORT, refused across hosts, and
leaving nothing in /dev/shm once every local rank mapped the segments."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.shm_segments import SEGMENT_MAGIC, creator_pid, leftovers, segments

from conftest import BIN, REPO, kill_quietly, output_tail, run_kolorun, worker_env
from kolo import _native

# Each rank lists kolo's segments in its job's segment directory (KOLO_SHM_DIR) right after
# init() (all ranks mapped them, so none may be left) and runs one allreduce to show the plane
# works.
SEGMENTS_AFTER_INIT = (
    "import os, glob, torch, kolo.torch as hvd; hvd.init(); "
    "left = glob.glob(os.path.join(os.environ['KOLO_SHM_DIR'], 'kolo-*')); "
    "t = hvd.allreduce(torch.ones(4) * (hvd.rank() + 1), op=hvd.Sum); "
    "print('rank', hvd.rank(), 'left', len(left), 'sum', float(t[0]))"
)


def test_build_info_reports_shared_memory() -> None:
    assert _native.build_info()["shm"] is True


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A segment directory of the test's own on /dev/shm's tmpfs (``KOLO_SHM_DIR``): other
    jobs on the machine, such as the suite's other xdist worker's, use /dev/shm itself."""
    path = Path("/dev/shm") / f"shmtest-{secrets.token_hex(6)}"
    path.mkdir(mode=0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_segments_are_gone_once_every_rank_mapped_them(shm_dir) -> None:
    result = run_kolorun(
        ["-np", "3", "python", "-c", SEGMENTS_AFTER_INIT],
        timeout=120,
        env={"KOLO_TRANSPORT": "shm", "KOLO_SHM_DIR": str(shm_dir)},
    )
    assert result.returncode == 0, output_tail(result)
    for rank in range(3):
        assert f"[{rank}]<stdout>:rank {rank} left 0 sum 6.0" in result.stdout, result.stdout


def test_forcing_shm_across_hosts_is_a_config_error() -> None:
    code = (
        "import os; os.environ['KOLO_HOSTNAME'] = 'simhost' + os.environ['KOLO_TASK_INDEX']; "
        "import kolo.torch as hvd; hvd.init()"
    )
    stderr = failed_init({"KOLO_TRANSPORT": "shm"}, code)
    assert "KOLO_TRANSPORT=shm needs every rank on one host" in stderr, stderr[-3000:]


def test_an_unknown_transport_is_a_config_error() -> None:
    stderr = failed_init({"KOLO_TRANSPORT": "carrier-pigeon"})
    assert "is not a transport; use tcp, shm or auto" in stderr, stderr[-3000:]


def failed_init(env: dict[str, str], code: str = "import kolo.torch as hvd; hvd.init()") -> str:
    """Runs `code` on 2 ranks with `env`, checks that the job failed, and returns its stderr."""
    result = run_kolorun(["-np", "2", "python", "-c", code], timeout=120, env=env)
    assert result.returncode != 0, output_tail(result)
    return result.stderr


# Each rank checks every collective that writes a shared half, over sizes that take one phase
# or many and copies short and long (the allreduce's largest is 3 MiB of integers, exact).
EVERY_COLLECTIVE = (
    "import torch, kolo.torch as hvd; hvd.init(); r = hvd.rank(); "
    "sizes = [3, 5000, 300000, 786433]; "
    "ok = all(torch.equal(hvd.allreduce(torch.arange(n, dtype=torch.float32) * (r + 1), "
    "op=hvd.Sum, name=f'a{n}'), torch.arange(n, dtype=torch.float32) * 3) for n in sizes); "
    "ok &= all(torch.equal(hvd.allgather(torch.full((n,), float(r)), name=f'g{n}'), "
    "torch.cat([torch.zeros(n), torch.ones(n)])) for n in sizes); "
    "ok &= all(torch.equal(hvd.broadcast(torch.full((n,), float(r + 7)), 1, name=f'b{n}'), "
    "torch.full((n,), 8.0)) for n in sizes); "
    "ok &= all(torch.equal(hvd.reducescatter(torch.arange(2 * n, dtype=torch.float32), "
    "op=hvd.Sum, name=f'r{n}'), 2 * torch.arange(2 * n, dtype=torch.float32)[r * n:(r + 1) * n]) "
    "for n in sizes); "
    "print('rank', r, 'correct', ok)"
)


@pytest.mark.parametrize("way", ["streaming", "ordinary"])
def test_every_collective_is_exact_with_each_way_of_storing_into_shared_memory(way) -> None:
    """docs/transport.md "Stores into a half": KOLO_SHM_STORES fixes the way; both are exact."""
    result = run_kolorun(
        ["-np", "2", "python", "-c", EVERY_COLLECTIVE],
        timeout=120,
        env={"KOLO_TRANSPORT": "shm", "KOLO_SHM_STORES": way},
    )
    assert result.returncode == 0, output_tail(result)
    for rank in range(2):
        assert f"[{rank}]<stdout>:rank {rank} correct True" in result.stdout, result.stdout


def test_an_unknown_way_of_storing_into_shared_memory_is_a_config_error() -> None:
    stderr = failed_init({"KOLO_TRANSPORT": "shm", "KOLO_SHM_STORES": "nt"})
    assert 'ConfigError: KOLO_SHM_STORES="nt" is not a way to store into shared memory' in stderr, (
        stderr[-3000:]
    )


# Each rank writes its pid, then joins the job: init() stays inside the shared-memory setup
# (creating and reserving its segment) long enough for the test to SIGKILL it there.
PID_THEN_INIT = (
    "import os, sys, time; from kolo import _core; "
    "open(os.path.join(sys.argv[1], os.environ['KOLO_TASK_INDEX'] + '.pid'), 'w')"
    ".write(str(os.getpid())); "
    "_core.start_engine(); time.sleep(60)"
)


def segment_files(shm_dir: Path) -> list[Path]:
    return [shm_dir / name for name in sorted(segments(shm_dir))]


def test_segments_of_ranks_killed_before_unlink_are_reclaimed_by_the_next_init(
    tmp_path, shm_dir
) -> None:
    """Issue 20: a crash between creating a segment and unlinking it used to leave the segment
    (and its memory) behind for good. Two ranks are SIGKILLed while their segments exist
    (large halves make reserving one take a while); the next job in the same directory starts,
    reduces correctly, and leaves the directory empty: the dead ranks' segments reclaimed."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    env = {"KOLO_TRANSPORT": "shm", "KOLO_SHM_DIR": str(shm_dir)}
    crashed = subprocess.Popen(
        [str(BIN / "kolorun"), "-np", "2", "python", "-c", PID_THEN_INIT, str(pid_dir)],
        cwd=REPO,
        env=worker_env({**env, "KOLO_SHM_CHUNK_BYTES": str(128 << 20)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:
            pids = [int(p.read_text()) for p in pid_dir.glob("*.pid") if p.read_text()]
            time.sleep(0.01)
        assert len(pids) == 2, "the ranks did not start"
        # Kill both ranks the moment a segment carries its creator's pid, mid-setup.
        while time.monotonic() < deadline:
            if any(creator_pid(s) in pids for s in segment_files(shm_dir)):
                break
            time.sleep(0.001)
        for pid in pids:
            kill_quietly(pid)
        output, _ = crashed.communicate(timeout=60)
        assert crashed.returncode != 0, output
        left = segment_files(shm_dir)
        # The test hit the window: segments of the killed ranks are left behind.
        assert left, f"no segment left: the ranks were not killed mid-setup\n{output[-2000:]}"
        assert all(creator_pid(s) in pids for s in left), [(s.name, creator_pid(s)) for s in left]

        result = run_kolorun(
            ["-np", "2", "python", "-c", SEGMENTS_AFTER_INIT],
            timeout=120,
            env={**env, "KOLO_SHM_CHUNK_BYTES": str(1 << 20)},
        )
        assert result.returncode == 0, output_tail(result)
        for rank in range(2):
            assert f"[{rank}]<stdout>:rank {rank} left 0 sum 3.0" in result.stdout, result.stdout
        assert segment_files(shm_dir) == [], "stale or fresh segments left after the clean job"
    finally:
        for pid in pids:
            kill_quietly(pid)
        if crashed.poll() is None:
            crashed.send_signal(signal.SIGKILL)
            crashed.wait(timeout=30)


def test_leftovers_are_the_new_segments_of_dead_creators(shm_dir) -> None:
    """tests/support/shm_segments.py, which the suites' leak checks use while the other lane's
    jobs set theirs up: a new segment whose creator is dead is a leftover; one whose creator
    runs, or that existed before, is not."""
    child = subprocess.Popen(["true"])  # a pid that has exited (and was reaped)
    child.wait()
    old = shm_dir / "kolo-old-0"
    old.write_bytes(SEGMENT_MAGIC + child.pid.to_bytes(4, "little"))
    before = segments(shm_dir)
    (shm_dir / "kolo-live-0").write_bytes(SEGMENT_MAGIC + os.getpid().to_bytes(4, "little"))
    (shm_dir / "kolo-dead-0").write_bytes(SEGMENT_MAGIC + child.pid.to_bytes(4, "little"))
    (shm_dir / "kolo-headerless-0").write_bytes(b"")
    (shm_dir / "other-0").write_bytes(b"")
    assert leftovers(before, shm_dir) == ["kolo-dead-0", "kolo-headerless-0"]
