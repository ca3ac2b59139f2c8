"""kolorun's command line: output prefixes, per-rank files, start timeouts, errors, check-build."""

from __future__ import annotations

import json
import signal
import subprocess
import time

from conftest import BIN, REPO, kill_quietly, pid_alive, run_kolorun, worker_env

PRINT_RANKS = (
    "import json, kolo.torch as hvd; hvd.init(); "
    "print(json.dumps(dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), "
    "local_size=hvd.local_size(), cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size())))"
)


def rank_lines(stdout: str) -> dict[int, dict]:
    found = {}
    for line in stdout.splitlines():
        prefix, _, payload = line.partition("<stdout>:")
        if payload.startswith("{"):
            info = json.loads(payload)
            assert prefix == f"[{info['rank']}]", line
            found[info["rank"]] = info
    return found


def test_local_ranks_get_prefixed_output_and_consecutive_assignment() -> None:
    result = run_kolorun(["-np", "3", "python", "-c", PRINT_RANKS], timeout=120)
    assert result.returncode == 0, result.stderr
    ranks = rank_lines(result.stdout)
    assert sorted(ranks) == [0, 1, 2]
    for rank, info in ranks.items():
        assert info == dict(
            rank=rank, size=3, local_rank=rank, local_size=3, cross_rank=0, cross_size=1
        )


def test_stderr_is_prefixed_and_output_files_are_written(tmp_path) -> None:
    code = (
        "import sys, kolo.torch as hvd; hvd.init(); "
        "print('out', hvd.rank()); print('err', hvd.rank(), file=sys.stderr)"
    )
    result = run_kolorun(
        ["-np", "2", "--output-filename", str(tmp_path), "python", "-c", code], timeout=120
    )
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:out {rank}" in result.stdout
        assert f"[{rank}]<stderr>:err {rank}" in result.stderr
        assert (tmp_path / f"rank.{rank}" / "stdout").read_text().strip() == f"out {rank}"
        assert f"err {rank}" in (tmp_path / f"rank.{rank}" / "stderr").read_text()


def test_nonzero_exit_is_reported_with_rank_and_code() -> None:
    code = (
        "import os, sys, time; i = int(os.environ['KOLO_TASK_INDEX']); "
        "time.sleep(0 if i else 60); sys.exit(7 if i else 0)"
    )
    result = run_kolorun(["-np", "2", "python", "-c", code], timeout=60)
    assert result.returncode == 7, (result.returncode, result.stderr)
    assert "rank 1" in result.stderr and "7" in result.stderr, result.stderr


def test_start_timeout_names_how_many_ranks_registered() -> None:
    code = (
        "import os, kolo.torch as hvd; hvd.init() if os.environ['KOLO_TASK_INDEX'] == '0' else None"
    )
    result = run_kolorun(["-np", "2", "--start-timeout", "15", "python", "-c", code], timeout=90)
    assert result.returncode != 0
    assert "RendezvousError" in result.stderr, result.stderr[-3000:]
    assert "1 of 2" in result.stderr, result.stderr[-3000:]


def test_bad_arguments_are_clear_errors() -> None:
    result = run_kolorun(["-np", "4", "-H", "localhost:2", "python", "-c", "pass"], timeout=30)
    assert result.returncode == 2
    assert "4" in result.stderr and "2" in result.stderr, result.stderr
    result = run_kolorun(["-np", "zero", "python"], timeout=30)
    assert result.returncode == 2
    assert "-np" in result.stderr, result.stderr
    result = run_kolorun(["-np", "2"], timeout=30)
    assert result.returncode == 2
    assert "command" in result.stderr.lower(), result.stderr


ENGINE_VARS = (
    "KOLO_FUSION_THRESHOLD",
    "KOLO_CYCLE_TIME",
    "KOLO_CACHE_CAPACITY",
    "KOLO_STALL_CHECK_DISABLE",
    "KOLO_LOG_LEVEL",
    "KOLO_TIMELINE",
)
PRINT_ENGINE_VARS = (
    "import json, os, kolo.torch as hvd; hvd.init(); "
    "print(json.dumps(dict(rank=hvd.rank(), "
    f"env={{k: os.environ.get(k) for k in {ENGINE_VARS!r}}})))"
)


def test_engine_flags_reach_every_rank_as_environment_variables() -> None:
    result = run_kolorun(
        [
            "-np",
            "2",
            "--fusion-threshold-mb",
            "2",
            "--cycle-time-ms",
            "3",
            "--cache-capacity",
            "7",
            "--no-stall-check",
            "--log-level",
            "DEBUG",
            "python",
            "-c",
            PRINT_ENGINE_VARS,
        ],
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = rank_lines(result.stdout)
    assert sorted(ranks) == [0, 1], result.stdout
    for info in ranks.values():
        assert info["env"] == {
            "KOLO_FUSION_THRESHOLD": str(2 * 1024 * 1024),
            "KOLO_CYCLE_TIME": "3",
            "KOLO_CACHE_CAPACITY": "7",
            "KOLO_STALL_CHECK_DISABLE": "1",
            "KOLO_LOG_LEVEL": "debug",
            "KOLO_TIMELINE": None,
        }, info
    result = run_kolorun(["-np", "2", "--cycle-time-ms", "0", "python", "-c", "pass"], timeout=30)
    assert result.returncode == 2
    assert '--cycle-time-ms "0"' in result.stderr and "milliseconds" in result.stderr, result.stderr


def test_check_build_reports_this_build() -> None:
    result = run_kolorun(["--check-build"], timeout=30)
    assert result.returncode == 0, result.stderr
    assert "[X] PyTorch" in result.stdout
    assert "[X] TCP" in result.stdout
    assert "[ ] NCCL" in result.stdout
    assert "[ ] MPI" in result.stdout


def test_ctrl_c_stops_every_rank(tmp_path) -> None:
    code = (
        "import os, sys, time, kolo.torch as hvd; hvd.init(); "
        f"open(os.path.join({str(tmp_path)!r}, f'rank{{hvd.rank()}}.pid'), 'w')"
        ".write(str(os.getpid())); print('ready', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen(
        [str(BIN / "kolorun"), "-np", "2", "python", "-c", code],
        cwd=REPO,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:
            pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid") if p.read_text()]
            time.sleep(0.2)
        assert len(pids) == 2, "ranks did not start"
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert time.monotonic() - started < 30
        assert not [pid for pid in pids if pid_alive(pid)], "a rank survived Ctrl-C"
    finally:
        proc.kill()
        for pid in pids:
            kill_quietly(pid)
