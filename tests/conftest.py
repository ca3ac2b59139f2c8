"""Shared helpers for the end-to-end suites: run kolorun and worker scripts as real processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# Storage servers on 127.0.0.1 (moto, fake-gcs-server, Azurite, MiniDFS) as fixtures.
from support.emulators import (  # noqa: F401
    azure_prefix,
    azure_server,
    gcs_prefix,
    gcs_server,
    hdfs_prefix,
    hdfs_server,
    remote_prefix,
    s3_prefix,
    s3_server,
)
from support.processes import pid_alive  # noqa: F401  (the tests import it from here)
from support.ray import ray_local  # noqa: F401
from support.spark import connect_server, connect_spark, spark, standalone_cluster  # noqa: F401

# The suites' JVMs (Spark drivers and executors, the standalone cluster, the Connect server,
# MiniDFS) live for seconds to minutes: C1 alone compiles them well enough, and leaving out C2's
# compiler threads cut the Spark suites' CPU time by 13 % (their wall time by 3-10 %).
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")
# One intra-op thread per process (what torchrun sets for several ranks per host; Spark's and
# Ray's workers get it already): the suites run 2-4 ranks beside the other lane on 2 cores, and
# each rank's OpenMP pool of one thread per core spins after every parallel op. Measured: the
# 4-rank shared-memory fusion job 25 s -> 8 s, three quarters of its CPU time had been libgomp.
os.environ.setdefault("OMP_NUM_THREADS", "1")

#: Session fixtures that start a cluster or a server. dev/test.sh runs the suite in two lanes at
#: once (two pytest processes, ``--lane clusters`` and ``--lane processes``): the modules that use
#: one of these, or are marked spark or ray, run in one lane, in order, so each cluster starts
#: once and no two Spark or Ray clusters run at once; every other module (rank processes that
#: often wait on timeouts) runs in the other.
CLUSTER_FIXTURES = frozenset(
    {
        "spark",
        "standalone_cluster",
        "connect_server",
        "connect_spark",
        "ray_local",
        "s3_server",
        "gcs_server",
        "azure_server",
        "hdfs_server",
        "remote_prefix",  # each storage server in turn, through request.getfixturevalue
    }
)
LANES = ("clusters", "processes")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lane",
        choices=LANES,
        help="run one lane of the suite: the modules that use a Spark, Ray or storage-server "
        "session fixture (clusters), or the others (processes); dev/test.sh runs both at once",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--lane``, deselects the modules of the other lane."""
    lane = config.getoption("lane")
    if lane is None:
        return
    clusters = {
        item.path
        for item in items
        if item.get_closest_marker("spark")
        or item.get_closest_marker("ray")
        or CLUSTER_FIXTURES.intersection(item.fixturenames)
    }
    keep, other = [], []
    for item in items:
        (keep if (item.path in clusters) == (lane == "clusters") else other).append(item)
    config.hook.pytest_deselected(items=other)
    items[:] = keep


REPO = Path(__file__).resolve().parents[1]
WORKERS = Path(__file__).resolve().parent / "workers"
BIN = Path(sys.executable).parent


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for launched processes: this venv first on PATH, unbuffered output."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    for key in [k for k in env if k.startswith("KOLO_") and k != "KOLO_LOG_LEVEL"]:
        del env[key]
    env.update(extra or {})
    return env


def run_kolorun(
    args: list[str], timeout: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Runs ``kolorun ARGS`` from the repo root and returns the finished process."""
    return subprocess.run(
        [str(BIN / "kolorun"), *args],
        cwd=REPO,
        env=worker_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


_RANK_LINE = re.compile(r"^\[(\d+)\]<(?:stdout|stderr)>:")


def output_tail(result: subprocess.CompletedProcess, lines: int = 30) -> str:
    """The end of a finished launch's output for an assertion message: the last ``lines`` lines
    of each rank (kolorun prefixes them ``[i]<stream>:``) and of everything else, so a failure
    shows the rank that failed first, not only the rank that printed last."""
    groups: dict[str, list[str]] = {}
    for line in (result.stdout + "\n" + result.stderr).splitlines():
        if not line.strip():
            continue
        match = _RANK_LINE.match(line)
        groups.setdefault(f"rank {match.group(1)}" if match else "launcher", []).append(line)
    return "\n".join(
        f"--- {name} (last {lines} lines) ---\n" + "\n".join(group[-lines:])
        for name, group in sorted(groups.items())
    )


def check_scenario(
    result: subprocess.CompletedProcess,
    scenario: str,
    order: tuple[str, ...],
    ranks: int = 2,
    launch: str = "",
) -> subprocess.CompletedProcess:
    """Asserts that every rank of a launch that ran the worker scenarios ``order`` printed
    ``rank R: <scenario> ok``; checking the last scenario also asserts that the launch exited
    0. ``launch`` names the launch in the message (e.g. the backend)."""
    missing = [
        r for r in range(ranks) if f"[{r}]<stdout>:rank {r}: {scenario} ok" not in result.stdout
    ]
    assert not missing, (
        f"{launch + ': ' if launch else ''}scenario {scenario!r} did not pass on rank(s) "
        f"{missing} (exit {result.returncode}; scenarios run in the order {order})\n"
        + output_tail(result)
    )
    if scenario == order[-1]:
        assert result.returncode == 0, output_tail(result)
    return result


def check_digits_example(script: str) -> None:
    """Runs ``examples/<script>`` (a sklearn-digits example whose ranks print ``rank R: weights
    checksum C`` and rank 0 ``test accuracy A``) on 2 ranks: the ranks must end with the same
    weights and a useful model (accuracy above 0.9)."""
    result = run_kolorun(
        ["-np", "2", "python", f"examples/{script}"],
        timeout=300,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, output_tail(result)
    sums = re.findall(r"rank (\d): weights checksum (\w+)", result.stdout)
    assert len(sums) == 2 and sums[0][1] == sums[1][1], output_tail(result)
    accuracy = float(re.search(r"test accuracy (\d\.\d+)", result.stdout).group(1))
    assert accuracy > 0.9, output_tail(result)


def worker(name: str) -> str:
    """The path of a worker script under tests/workers."""
    return str(WORKERS / name)


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def kolorun():
    return run_kolorun
