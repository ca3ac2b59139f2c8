"""Real rank processes of an elastic job, launched the way a launcher does it, for tests and
benchmarks that kill and add ranks.

:class:`ElasticRanks` owns one ``kolo._native.LaunchDriver`` in elastic mode (in this process)
and the rank subprocesses it starts with ``driver.worker_env(task)``. Like a launcher, it
watches every rank process and calls ``driver.remove_task(task, reason)`` as soon as one exits
with a failure (a SIGKILL included), and ``add`` calls ``driver.add_tasks([task])`` before it
starts the new task's process. Each rank's stdout and stderr are read by threads (no pipe can
fill up), line by line, with the time each line arrived. The ranks' shared-memory segments go
to a directory of their own (``KOLO_SHM_DIR``), so :meth:`ElasticRanks.leftovers` can tell that
nothing of the job outlived it (other jobs on the machine use ``/dev/shm``).

Example::

    with ElasticRanks(3, min_np=2, max_np=3) as ranks:
        for task in range(3):
            ranks.start(task, [sys.executable, "worker.py"])
        ranks.wait_for(2, lambda line: line.startswith("epoch 1"), timeout=60)
        ranks.kill(2)
        results = ranks.finish([0, 1], timeout=60)   # {task: RankResult}
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from kolo._native import LaunchDriver

REPO = Path(__file__).resolve().parents[2]


def rank_env(extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    """This process's environment for a rank: this venv first on ``PATH``, unbuffered output,
    no ``KOLO_*`` variable of ours (but ``KOLO_LOG_LEVEL``), then ``extra``."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    for key in [k for k in env if k.startswith("KOLO_") and k != "KOLO_LOG_LEVEL"]:
        del env[key]
    env.update(extra or {})
    return env


def describe_exit(returncode: int) -> str:
    """How a launcher words a rank's exit: ``"was killed by signal 9 (SIGKILL)"``."""
    if returncode < 0:
        return f"was killed by signal {-returncode} ({signal.Signals(-returncode).name})"
    return f"exited with code {returncode}"


@dataclass
class RankProcess:
    """One rank process: its task index, the process, and its output lines so far as
    ``(arrival time.time(), line)``."""

    task: int
    process: subprocess.Popen
    stdout: list[tuple[float, str]] = field(default_factory=list)
    stderr: list[tuple[float, str]] = field(default_factory=list)
    removed_at: Optional[float] = None
    readers: list[threading.Thread] = field(default_factory=list)

    def text(self, stream: str = "stdout") -> str:
        """The stream's lines so far, joined."""
        return "\n".join(line for _, line in getattr(self, stream))


@dataclass
class RankResult:
    """A finished rank: exit code and whole output."""

    task: int
    returncode: int
    stdout: str
    stderr: str


class ElasticRanks:
    """An elastic ``LaunchDriver`` and the rank processes of its job (see the module doc).

    Args:
        num_tasks: the tasks of the first round (``LaunchDriver``'s ``num_tasks``).
        min_np, max_np: the job's elastic bounds.
        env: extra environment for every rank (on top of :func:`rank_env`).
        start_timeout, heartbeat_timeout, elastic_timeout: passed to the driver.
    """

    def __init__(
        self,
        num_tasks: int,
        min_np: int,
        max_np: int,
        env: Optional[dict[str, str]] = None,
        start_timeout: float = 60.0,
        heartbeat_timeout: float = 5.0,
        elastic_timeout: float = 600.0,
    ) -> None:
        self.driver = LaunchDriver(
            num_tasks,
            start_timeout=start_timeout,
            heartbeat_timeout=heartbeat_timeout,
            min_np=min_np,
            max_np=max_np,
            elastic_timeout=elastic_timeout,
        )
        self.shm_dir = tempfile.mkdtemp(prefix="kolo-elastic-shm-")
        self.env = {"KOLO_SHM_DIR": self.shm_dir, **(env or {})}
        self.ranks: dict[int, RankProcess] = {}
        self._changed = threading.Condition()
        self._closing = False

    # -- processes ---------------------------------------------------------------------------

    def start(self, task: int, argv: Sequence[str]) -> RankProcess:
        """Starts task ``task``'s process running ``argv`` (from the repo root)."""
        process = subprocess.Popen(
            list(argv),
            cwd=REPO,
            env=rank_env({**self.env, **dict(self.driver.worker_env(task))}),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        rank = RankProcess(task, process)
        self.ranks[task] = rank
        for name in ("stdout", "stderr"):
            reader = threading.Thread(target=self._read, args=(rank, name), daemon=True)
            reader.start()
            rank.readers.append(reader)
        threading.Thread(target=self._watch, args=(rank,), daemon=True).start()
        return rank

    def add(self, task: int, argv: Sequence[str]) -> RankProcess:
        """Adds task ``task`` to the job (it joins at the next round) and starts its process."""
        self.driver.add_tasks([task])
        return self.start(task, argv)

    def kill(self, task: int) -> float:
        """SIGKILLs task ``task``'s process and returns the ``time.time()`` of the kill; the
        watcher then removes the task from the job, as a launcher does."""
        killed_at = time.time()
        os.kill(self.ranks[task].process.pid, signal.SIGKILL)
        return killed_at

    def _read(self, rank: RankProcess, name: str) -> None:
        lines = getattr(rank, name)
        for line in getattr(rank.process, name):
            with self._changed:
                lines.append((time.time(), line.rstrip("\n")))
                self._changed.notify_all()

    def _watch(self, rank: RankProcess) -> None:
        returncode = rank.process.wait()
        if returncode != 0 and not self._closing:
            self.driver.remove_task(rank.task, describe_exit(returncode))
            rank.removed_at = time.time()
        with self._changed:
            self._changed.notify_all()

    # -- waiting -----------------------------------------------------------------------------

    def wait_for(
        self, task: int, predicate: Callable[[str], bool], timeout: float, stream: str = "stdout"
    ) -> str:
        """The first line of task ``task``'s ``stream`` for which ``predicate`` holds; raises
        ``AssertionError`` (with the rank's output) when none came within ``timeout`` seconds
        or the process exited without one."""
        rank = self.ranks[task]
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                lines = getattr(rank, stream)
                for _, line in lines[seen:]:
                    if predicate(line):
                        return line
                seen = len(lines)
                left = deadline - time.monotonic()
                if left <= 0 or rank.process.poll() is not None:
                    raise AssertionError(
                        f"task {task} printed no matching line (exit {rank.process.poll()}):\n"
                        f"{rank.text()[-3000:]}\n{rank.text('stderr')[-5000:]}"
                    )
                self._changed.wait(min(left, 0.5))

    def finish(self, tasks: Sequence[int], timeout: float) -> dict[int, RankResult]:
        """Waits for the processes of ``tasks`` to exit (all within ``timeout`` seconds) and
        returns their results; one still running then is killed and reported with its output."""
        deadline = time.monotonic() + timeout
        results = {}
        for task in tasks:
            rank = self.ranks[task]
            try:
                rank.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                rank.process.kill()
                rank.process.wait()
                for reader in rank.readers:
                    reader.join(timeout=5)
                raise AssertionError(
                    f"task {task} did not finish within {timeout} s:\n{rank.text()[-3000:]}\n"
                    f"{rank.text('stderr')[-5000:]}"
                ) from None
            for reader in rank.readers:
                reader.join(timeout=5)
            results[task] = RankResult(
                task, rank.process.returncode, rank.text(), rank.text("stderr")
            )
        return results

    # -- cleanup -----------------------------------------------------------------------------

    def leftovers(self) -> list[str]:
        """What of the job is still there: rank processes still running, shared-memory
        segments still in the ranks' segment directory (empty when all went away cleanly,
        killed ranks included)."""
        running = [
            f"task {r.task} (pid {r.process.pid}) is running"
            for r in self.ranks.values()
            if r.process.poll() is None
        ]
        return running + [f"segment {name}" for name in sorted(os.listdir(self.shm_dir))]

    def close(self) -> None:
        """Kills the rank processes still running and shuts the driver down."""
        self._closing = True
        for rank in self.ranks.values():
            if rank.process.poll() is None:
                rank.process.kill()
            rank.process.wait()
        self.driver.shutdown()
        shutil.rmtree(self.shm_dir, ignore_errors=True)

    def __enter__(self) -> ElasticRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
