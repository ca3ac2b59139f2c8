"""A job of many torch ranks on one small machine: ``run_forked_ranks`` runs a
``kolo._native.LaunchDriver`` in this process (the job driver the Spark and Ray launchers use)
and one zygote process (tests/workers/scale_rank_worker.py ``--fork``) that loads torch once
and forks every rank from it. Each rank is a real process with its own engine, rendezvous and
data plane; what forking saves is the ~400 MiB of private memory (and ~1 s of CPU) that each
process's own ``import torch`` costs, which puts 64 torch ranks beyond 24 GiB otherwise.

Example::

    result = run_forked_ranks(16, ranks_per_host=4, modes=["train"], timeout=120)
    assert result.returncode == 0 and len(result.reports) == 16
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kolo._native import LaunchDriver

WORKER = Path(__file__).resolve().parents[1] / "workers" / "scale_rank_worker.py"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class ForkedRun:
    """A finished forked job: the zygote's exit code and output, and each rank's report."""

    returncode: int
    stdout: str
    stderr: str
    #: The ``SCALE`` reports by rank.
    reports: dict[int, dict] = field(default_factory=dict)
    #: Seconds from the start of the launch (driver created) until the zygote exited.
    seconds: float = 0.0
    #: ``time.time()`` when the launch started (to compare with the reports' timestamps).
    launched: float = 0.0


def run_forked_ranks(
    n: int,
    ranks_per_host: int,
    modes: list[str],
    timeout: float,
    env: dict[str, str],
) -> ForkedRun:
    """Runs ``modes`` on ``n`` forked ranks, ``ranks_per_host`` per simulated host; ``env`` is
    the zygote's whole environment (the ranks add the driver's variables). Every wait is
    bounded: the zygote kills ranks still running after ``timeout`` and is itself killed
    ``timeout + 30`` seconds after it starts."""
    launched = time.time()
    began = time.perf_counter()
    driver = LaunchDriver(n, start_timeout=max(60.0, timeout / 2))
    try:
        envs = [
            {**driver.worker_env(task), "KOLO_TEST_RANKS_PER_HOST": str(ranks_per_host)}
            for task in range(n)
        ]
        proc = subprocess.run(
            [sys.executable, str(WORKER), "--fork", str(timeout)],
            input=json.dumps({"envs": envs, "modes": modes}),
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout + 30,
        )
    finally:
        driver.shutdown()
    reports = {}
    for line in proc.stdout.splitlines():
        if line.startswith("SCALE "):
            report = json.loads(line[len("SCALE ") :])
            reports[report["rank"]] = report
    return ForkedRun(
        proc.returncode,
        proc.stdout,
        proc.stderr,
        reports,
        time.perf_counter() - began,
        launched,
    )
