"""Horovod 0.28.1 as a bench peer: where bench/peers/horovod.sh put it, and an elastic
``horovodrun --gloo`` job on this machine whose workers bench/elastic.py watches and kills.

:func:`horovod_python` says whether the peer venv is there (benches include Horovod "when
present"). :class:`HorovodElasticJob` runs ``horovodrun --gloo -np .. --min-np .. --max-np ..
--host-discovery-script S`` on ``bench/_elastic_rank.py --horovod``. One machine plays the
hosts the way Horovod's own elastic tests do (test/integration/test_elastic_torch.py):
``localhost`` and ``127.0.0.1`` are two hosts, both local to horovodrun, so it starts their
workers without ssh. ``S`` prints the lines of a hosts file that :meth:`set_hosts` rewrites,
and stamps the time it first printed a host the bench added (Horovod polls it every second),
so the figures can tell the discovery poll from the rest.

Example::

    python = horovod_python()
    if python is not None:
        with HorovodElasticJob(python, ["localhost:1", "127.0.0.1:1"], np=2, min_np=1,
                               max_np=2) as job:
            job.wait_event("localhost[0]", "step", after=0.0)
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

HERE = Path(__file__).resolve().parent
RANK_SCRIPT = HERE.parent / "_elastic_rank.py"
BUILD_SCRIPT = HERE / "horovod.sh"


class HorovodJobEnded(RuntimeError):
    """horovodrun exited (its elastic driver ended the job) before a line the bench waited
    for; ``reason`` says why, from its log."""

    def __init__(self, reason: str, output: str) -> None:
        super().__init__(f"{reason}\n{output}")
        self.reason = reason


def horovod_venv() -> Path:
    """Where bench/peers/horovod.sh builds the peer venv (``KOLO_BENCH_CACHE`` as there)."""
    cache = os.environ.get("KOLO_BENCH_CACHE") or str(Path.home() / ".cache/kolo-bench")
    return Path(cache) / "horovod-venv"


def horovod_python(venv: Optional[Path] = None) -> Optional[Path]:
    """The peer venv's python when Horovod is built there (its ``horovodrun`` exists), else
    None: run bench/peers/horovod.sh to build it."""
    venv = venv or horovod_venv()
    python, horovodrun = venv / "bin/python", venv / "bin/horovodrun"
    return python if python.exists() and horovodrun.exists() else None


def peer_versions(python: Path) -> dict[str, str]:
    """The peer venv's Horovod, torch and Python versions."""
    out = subprocess.run(
        [
            str(python),
            "-c",
            "import horovod, torch, platform; "
            "print(horovod.__version__, torch.__version__, platform.python_version())",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    return {"horovod": out[0], "torch": out[1], "python": out[2]}


# The discovery script: prints the hosts file and stamps (once per host line) when it first
# printed each line, in the stamps file, as "<time> <line>".
DISCOVERY = """#!/bin/sh
cat {hosts}
while read -r line; do
  grep -qxF "$line" {stamps} 2>/dev/null || echo "$(date +%s.%N) $line" >> {stamps}
done < {hosts}
"""


class HorovodElasticJob:
    """``horovodrun --gloo`` elastic on ``hosts`` (``"host:slots"`` lines) and the events its
    workers print (see the module doc). Leaving the ``with`` block ends the job and every
    worker it started.

    Args:
        python: the peer venv's python (:func:`horovod_python`).
        hosts: the discovery script's first answer.
        np, min_np, max_np: horovodrun's ``-np``, ``--min-np``, ``--max-np``.
        rank_args: arguments after the rank script (``--width``).
        env: extra environment for horovodrun and its workers.
    """

    def __init__(
        self,
        python: Path,
        hosts: Sequence[str],
        np: int,
        min_np: int,
        max_np: int,
        rank_args: Sequence[str] = (),
        env: Optional[dict[str, str]] = None,
    ) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="kolo-bench-horovod-"))
        self.hosts_file = self.folder / "hosts"
        self.stamps_file = self.folder / "discovered"
        self.set_hosts(hosts)
        script = self.folder / "discover.sh"
        script.write_text(
            DISCOVERY.format(
                hosts=shlex.quote(str(self.hosts_file)), stamps=shlex.quote(str(self.stamps_file))
            )
        )
        script.chmod(0o755)
        bin_dir = python.parent
        command = [
            str(bin_dir / "horovodrun"),
            "--gloo",
            "-np",
            str(np),
            "--min-np",
            str(min_np),
            "--max-np",
            str(max_np),
            "--host-discovery-script",
            str(script),
            # The loopback interface for gloo: every "host" here is this machine (and without
            # it an elastic horovodrun waits for two hosts to compare their interfaces).
            "--network-interface",
            "lo",
            # The driver's INFO log says when it saw a worker's exit ("record state: ...").
            "--log-level",
            "INFO",
            str(python),
            str(RANK_SCRIPT),
            "--horovod",
            *rank_args,
        ]
        full_env = dict(os.environ)
        # The peer venv only: none of the bench's own PYTHONPATH or venv.
        full_env.pop("PYTHONPATH", None)
        full_env.pop("VIRTUAL_ENV", None)
        full_env.update(
            PATH=f"{bin_dir}{os.pathsep}{full_env.get('PATH', '')}", PYTHONUNBUFFERED="1"
        )
        full_env.update(env or {})
        self.lines: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            command,
            cwd=self.folder,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def __enter__(self) -> HorovodElasticJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append((time.time(), line.rstrip("\n")))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def set_hosts(self, hosts: Sequence[str]) -> float:
        """Rewrites the hosts the discovery script prints (atomically); returns the time."""
        scratch = self.hosts_file.with_suffix(".new")
        scratch.write_text("".join(f"{h}\n" for h in hosts))
        scratch.replace(self.hosts_file)
        return time.time()

    def discovered(self, host_line: str, timeout: float = 60.0) -> float:
        """When the discovery script first printed ``host_line``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stamps_file.exists():
                for stamp in self.stamps_file.read_text().splitlines():
                    when, _, line = stamp.partition(" ")
                    if line == host_line:
                        return float(when)
            time.sleep(0.05)
        raise TimeoutError(f"the discovery script never printed {host_line!r}\n{self.text()}")

    def end_reason(self) -> str:
        """Why horovodrun ended the job: its exit code, the hosts its driver blacklisted and
        the first worker it names as failed."""
        with self._changed:
            lines = [line for _, line in self.lines]
        blacklisted = sorted({x.split()[-1] for x in lines if "blacklist failing host:" in x})
        first = [x.strip() for x in lines if x.startswith(("Process name:", "Exit code:"))]
        return (
            f"horovodrun exited {self.process.returncode}; blacklisted: "
            f"{', '.join(blacklisted) or 'none'}; first failed worker: {' '.join(first) or '?'}"
        )

    def text(self, last: int = 60) -> str:
        """horovodrun's last ``last`` output lines."""
        with self._changed:
            return "\n".join(line for _, line in self.lines[-last:])

    def wait_line(self, predicate: Callable[[str], bool], timeout: float) -> tuple[float, str]:
        """The first output line (``(arrival time, line)``) for which ``predicate`` holds."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for arrived, line in self.lines[seen:]:
                    if predicate(line):
                        return arrived, line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if self.process.poll() is not None and seen == len(self.lines):
                    raise HorovodJobEnded(self.end_reason(), self.text())
                if left <= 0:
                    raise TimeoutError(f"horovodrun timed out before the line\n{self.text()}")
                self._changed.wait(min(left, 0.5))

    def wait_event(self, slot: str, names: str, after: float, timeout: float = 120.0) -> float:
        """The time of worker ``slot``'s first ``names`` event (``a|b``: either) after
        ``after``."""
        wanted = names.split("|")

        def match(line: str) -> bool:
            fields = line.partition("event ")[2].split()
            return (
                len(fields) >= 6
                and fields[0] in wanted
                and fields[4] == slot
                and float(fields[1]) > after
            )

        return float(self.wait_line(match, timeout)[1].partition("event ")[2].split()[1])

    def wait_steps(self, slots: Sequence[str], size: int, timeout: float = 300.0) -> None:
        """Waits until every worker in ``slots`` completed a step in a round of ``size``."""
        for slot in slots:
            self.wait_line(
                lambda x, s=slot: (
                    (f := x.partition("event ")[2].split())[:1] == ["step"]
                    and f[3] == str(size)
                    and f[4] == s
                ),
                timeout,
            )

    def pid(self, slot: str) -> int:
        """The pid of worker ``slot``'s latest process (from its ``up`` event)."""
        found = [
            int(f[5])
            for _, line in list(self.lines)
            if (f := line.partition("event ")[2].split())[:1] == ["up"] and f[4] == slot
        ]
        if not found:
            raise LookupError(f"worker {slot} never started\n{self.text()}")
        return found[-1]

    def kill(self, slot: str) -> float:
        """SIGKILLs worker ``slot``; returns the time of the kill."""
        pid = self.pid(slot)
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        return killed

    def exit_seen(self, host: str, after: float, timeout: float = 30.0) -> Optional[float]:
        """When horovodrun's driver logged ``host``'s worker as failed (None: not in time)."""
        try:
            arrived, _ = self.wait_line(
                lambda x: f"record state: {host}[" in x and "FAILURE" in x, timeout
            )
        except TimeoutError:
            return None
        return arrived if arrived > after else None

    def close(self) -> None:
        """Ends horovodrun (SIGTERM, then SIGKILL), then SIGKILLs any worker of ours that
        outlived it (checked by its command line: a pid may have been reused)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=15)
        for pid in {int(f[5]) for f in self._events("up")}:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if str(RANK_SCRIPT).encode() in cmdline and b"--horovod" in cmdline:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for path in self.folder.iterdir():
            path.unlink()
        self.folder.rmdir()

    def _events(self, name: str) -> list[list[str]]:
        with self._changed:
            fields = [line.partition("event ")[2].split() for _, line in self.lines]
        return [f for f in fields if f[:1] == [name] and len(f) >= 6]
