"""The job driver service (the launchers' ``LaunchDriver``) seen from worker processes:
authentication, host-hash rank assignment over simulated hosts, and the abort broadcast."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from conftest import REPO, worker_env
from kolo._native import LaunchDriver

INIT = "import kolo.torch as hvd; hvd.init()"
REPORT = (
    "import json, torch, kolo.torch as hvd; hvd.init(); "
    "total = hvd.allreduce(torch.ones(1), op=hvd.Sum).item(); "
    "print(json.dumps(dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), "
    "local_size=hvd.local_size(), cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(), "
    "homogeneous=hvd.is_homogeneous(), total=total)))"
)
LOOP_UNTIL_ABORT = (
    "import sys, torch, kolo.torch as hvd; from kolo.exceptions import JobAbortedError; "
    "hvd.init(); print('ready', flush=True)\n"
    "try:\n"
    "    while True: hvd.allreduce(torch.ones(1024))\n"
    "except JobAbortedError as err:\n"
    "    print(f'aborted: {err}', flush=True)\n"
)


def spawn(code: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=worker_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_wrong_or_missing_secret_is_refused(capfd) -> None:
    driver = LaunchDriver(1, start_timeout=20)
    try:
        env = dict(driver.worker_env(0))
        env["KOLO_JOB_SECRET"] = "ab" * 32
        wrong = subprocess.run(
            [sys.executable, "-c", INIT],
            env=worker_env(env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert wrong.returncode != 0
        assert "RendezvousError" in wrong.stderr and "secret" in wrong.stderr, wrong.stderr
        del env["KOLO_JOB_SECRET"]
        missing = subprocess.run(
            [sys.executable, "-c", INIT],
            env=worker_env(env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert missing.returncode != 0
        assert "KOLO_JOB_SECRET" in missing.stderr, missing.stderr
        # The refusal is logged by the driver, naming the caller.
        assert "refused" in capfd.readouterr().err
        # The right secret still joins.
        ok = subprocess.run(
            [sys.executable, "-c", INIT],
            env=worker_env(dict(driver.worker_env(0))),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ok.returncode == 0, ok.stderr
    finally:
        driver.shutdown()


def test_ranks_are_consecutive_per_simulated_host_and_collectives_work() -> None:
    hosts = ["hostB", "hostA", "hostB", "hostA", "hostC"]
    driver = LaunchDriver(len(hosts), start_timeout=60)
    try:
        procs = [
            spawn(REPORT, {**driver.worker_env(task), "KOLO_HOSTNAME": host})
            for task, host in enumerate(hosts)
        ]
        outputs = [proc.communicate(timeout=120) for proc in procs]
        for proc, (_, err) in zip(procs, outputs):
            assert proc.returncode == 0, err
        infos = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
        # Host of task 0 (hostB) first, each host's ranks consecutive, task order within a host.
        assert [info["rank"] for info in infos] == [0, 2, 1, 3, 4]
        assert [info["local_rank"] for info in infos] == [0, 0, 1, 1, 0]
        assert [info["local_size"] for info in infos] == [2, 2, 2, 2, 1]
        # cross_rank: the host's ordinal among hosts having that local rank.
        assert [info["cross_rank"] for info in infos] == [0, 1, 0, 1, 2]
        assert [info["cross_size"] for info in infos] == [3, 3, 2, 2, 3]
        assert all(info["size"] == 5 and info["total"] == 5.0 for info in infos)
        assert not any(info["homogeneous"] for info in infos)
        assignment = driver.assignment()
        assert [row["rank"] for row in sorted(assignment, key=lambda r: r["task_index"])] == [
            0,
            2,
            1,
            3,
            4,
        ]
    finally:
        driver.shutdown()


def test_driver_abort_reaches_every_rank_inside_collectives() -> None:
    driver = LaunchDriver(2, start_timeout=60)
    try:
        procs = [spawn(LOOP_UNTIL_ABORT, driver.worker_env(task)) for task in range(2)]
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        started = time.monotonic()
        driver.abort("the operator stopped the job")
        outputs = [proc.communicate(timeout=30) for proc in procs]
        assert time.monotonic() - started < 10
        for proc, (out, err) in zip(procs, outputs):
            assert proc.returncode == 0, err
            assert "aborted: job aborted: the operator stopped the job" in out, out + err
    finally:
        for proc in procs:
            proc.kill()
        driver.shutdown()
