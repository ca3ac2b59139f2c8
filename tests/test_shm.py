"""The shared-memory transport's contract: chosen by KOLO_TRANSPORT, refused across hosts, and
leaving nothing in /dev/shm once every local rank mapped the segments."""

from __future__ import annotations

from conftest import run_kolorun
from kolo import _native

# Each rank lists kolo's segments in /dev/shm right after init() (all ranks mapped them, so
# none may be left) and runs one allreduce to show the plane works.
SEGMENTS_AFTER_INIT = (
    "import os, glob, torch, kolo.torch as hvd; hvd.init(); "
    "left = glob.glob('/dev/shm/kolo-*'); "
    "t = hvd.allreduce(torch.ones(4) * (hvd.rank() + 1), op=hvd.Sum); "
    "print('rank', hvd.rank(), 'left', len(left), 'sum', float(t[0]))"
)


def test_build_info_reports_shared_memory() -> None:
    assert _native.build_info()["shm"] is True


def test_segments_are_gone_once_every_rank_mapped_them() -> None:
    result = run_kolorun(
        ["-np", "3", "python", "-c", SEGMENTS_AFTER_INIT],
        timeout=120,
        env={"KOLO_TRANSPORT": "shm"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(3):
        assert f"[{rank}]<stdout>:rank {rank} left 0 sum 6.0" in result.stdout, result.stdout


def test_forcing_shm_across_hosts_is_a_config_error() -> None:
    code = (
        "import os; os.environ['KOLO_HOSTNAME'] = 'simhost' + os.environ['KOLO_TASK_INDEX']; "
        "import kolo.torch as hvd; hvd.init()"
    )
    result = run_kolorun(
        ["-np", "2", "python", "-c", code], timeout=120, env={"KOLO_TRANSPORT": "shm"}
    )
    assert result.returncode != 0
    assert "KOLO_TRANSPORT=shm needs every rank on one host" in result.stderr, result.stderr[-3000:]


def test_an_unknown_transport_is_a_config_error() -> None:
    result = run_kolorun(
        ["-np", "2", "python", "-c", "import kolo.torch as hvd; hvd.init()"],
        timeout=120,
        env={"KOLO_TRANSPORT": "carrier-pigeon"},
    )
    assert result.returncode != 0
    assert "is not a transport; use tcp, shm or auto" in result.stderr, result.stderr[-3000:]
