"""Horovod 0.28.1 beside kolo in one bench run: the same bench script, run again under
``horovodrun --gloo`` in the peer venv (bench/peers/horovod.sh) with ``--horovod-peer``, on
``horovod.torch`` instead of ``kolo.torch``.

A bench script that includes Horovod:

- calls :func:`add_arguments` (``--horovod auto|yes|no``, and the hidden ``--horovod-peer``
  its Horovod run gets) and picks its collective library with :func:`library` (Horovod's
  ``horovod.torch`` under ``--horovod-peer``, else ``kolo.torch``: both have the same API);
- in its kolo run, asks :func:`peer_python` whether the peer venv is there (it prints why
  Horovod is skipped when not) and runs its Horovod part with :class:`HorovodBeside` (inside a
  ``kolorun`` job: rank 0 runs ``horovodrun``, every rank gets the result) or
  :func:`run_horovod` (from one process), between its own timings, so machine noise hits both;
- in its Horovod run, measures what its kolo run measures and hands the figures back with
  :func:`emit_result` (rank 0).

Example (a 2-rank kolo job; bench/training.py does this)::

    python = peer_python(args.horovod, "training")
    if python is not None:
        with HorovodBeside(hvd, python, Path(__file__)) as horovod:
            figures = horovod.run(["--steps", "5"], timeout=600)

The peer runs on one host (``horovodrun -H localhost:N``, the loopback interface), with this
process's kolo first on its path (a bench script imports ``common``, which imports kolo; the
peer never initializes it) and without the kolo job's ``KOLO_*`` environment. Benches never
run it in CI: there is no peer venv there, and the smoke tests pass ``--horovod no``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Optional, Sequence

from peers._horovod import horovod_python, horovod_venv, peer_versions

#: The flag a bench script's Horovod run gets.
PEER_FLAG = "--horovod-peer"
#: The prefix of the line in which a Horovod run's rank 0 hands back its figures (JSON).
RESULT_MARK = "horovod-peer-result "
# The CPUs this process may use when it starts: a pinned kolo rank's child must not inherit
# its one core.
_CPUS = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


class HorovodPeerFailed(RuntimeError):
    """The Horovod run ended without figures (its exit code and output tail say why)."""


def running_as_peer(argv: Optional[Sequence[str]] = None) -> bool:
    """Whether this process is a bench script's Horovod run (``--horovod-peer``)."""
    return PEER_FLAG in (sys.argv if argv is None else argv)


def library() -> ModuleType:
    """``horovod.torch`` in a Horovod run, else ``kolo.torch`` (the same API)."""
    return importlib.import_module("horovod.torch" if running_as_peer() else "kolo.torch")


def add_arguments(parser: argparse.ArgumentParser, peer_flag: bool = True) -> None:
    """``--horovod auto|yes|no`` and (``peer_flag``: for a script that runs again as its own
    Horovod run) the hidden ``--horovod-peer``."""
    parser.add_argument(
        "--horovod",
        choices=("auto", "yes", "no"),
        default="auto",
        help="measure Horovod 0.28.1 beside kolo, interleaved in this run (auto: when "
        "bench/peers/horovod.sh built its venv; yes: fail when it did not; no: skip it)",
    )
    if peer_flag:
        parser.add_argument(PEER_FLAG, action="store_true", help=argparse.SUPPRESS)


def peer_python(choice: str, bench: str, announce: bool = True) -> Optional[Path]:
    """The peer venv's python when Horovod is to run (``choice`` as ``--horovod``), else None
    after printing why it is skipped (``announce``: print that line; a kolo rank other than
    0 passes False). ``yes`` without the venv exits with how to build it."""
    if choice == "no":
        if announce:
            print(f"{bench}: Horovod 0.28.1 skipped (--horovod no)", flush=True)
        return None
    python = horovod_python()
    if python is None:
        if choice == "yes":
            sys.exit(f"{bench}: no Horovod venv at {horovod_venv()}; run bench/peers/horovod.sh")
        if announce:
            print(
                f"{bench}: Horovod 0.28.1 skipped: no peer venv at {horovod_venv()} "
                "(bench/peers/horovod.sh builds it)",
                flush=True,
            )
    return python


def versions(python: Path) -> dict[str, str]:
    """The peer venv's Horovod, torch and Python versions (for the results' JSON)."""
    return peer_versions(python)


def emit_result(payload: dict[str, Any]) -> None:
    """Hands a Horovod run's figures back to the kolo run (call on rank 0 only)."""
    print(RESULT_MARK + json.dumps(payload), flush=True)


def kolo_path() -> str:
    """The folder this process imports kolo from: put first on the path of the Horovod
    venv's processes, so they import this checkout's kolo."""
    import kolo

    return str(Path(kolo.__file__).resolve().parents[1])


def _unpin() -> None:
    if _CPUS is not None:
        os.sched_setaffinity(0, _CPUS)


def run_horovod(
    python: Path, script: Path, args: Sequence[str], timeout: float, np: Optional[int] = None
) -> dict[str, Any]:
    """Runs ``script --horovod-peer args`` with the peer venv's python, on ``np`` Horovod ranks
    (``horovodrun --gloo`` on this host; ``np=None``: one process, which launches Horovod
    itself, e.g. Horovod's Spark estimator) and returns what its rank 0 passed to
    :func:`emit_result`. Raises :class:`HorovodPeerFailed` when it ends without it or
    outlives ``timeout`` seconds."""
    bin_dir = python.parent
    command = [str(python), str(script), PEER_FLAG, *args]
    if np is not None:
        launcher = [str(bin_dir / "horovodrun"), "--gloo", "-np", str(np), "-H", f"localhost:{np}"]
        command = [*launcher, "--network-interface", "lo", *command]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KOLO_", "HOROVOD_"))}
    env.pop("VIRTUAL_ENV", None)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=kolo_path(),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
    )
    process = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_unpin,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        raise HorovodPeerFailed(f"horovodrun outlived {timeout:g} s:\n{_tail(output)}") from None
    for line in output.splitlines():
        _, mark, payload = line.partition(RESULT_MARK)
        if mark and process.returncode == 0:
            return json.loads(payload)
    raise HorovodPeerFailed(f"horovodrun exited {process.returncode}:\n{_tail(output)}")


def _tail(output: str, lines: int = 40) -> str:
    return "\n".join(output.splitlines()[-lines:])


class HorovodBeside:
    """Runs a bench script's Horovod part from inside a kolo job on one host: rank 0 runs
    :func:`run_horovod`, every rank gets its figures. The ranks other than 0 wait for them by
    polling a file (no kolo collective stays pending while Horovod runs). Build it on every
    rank (it agrees on a folder); ``with`` removes the folder. The peer runs on one host: in
    a job over several, :meth:`run` hands back an error instead of figures.

    Args:
        hvd: ``kolo.torch`` (initialized).
        python: the peer venv's python (:func:`peer_python`).
        script: the bench script.
    """

    def __init__(self, hvd: ModuleType, python: Path, script: Path) -> None:
        self.hvd, self.python, self.script = hvd, python, script
        self.one_host = hvd.size() == hvd.local_size()
        folder = tempfile.mkdtemp(prefix="kolo-bench-horovod-") if hvd.rank() == 0 else None
        self.folder = Path(hvd.broadcast_object(folder, root_rank=0, name="bench.horovod.dir"))
        self.runs = 0

    def __enter__(self) -> HorovodBeside:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Removes the folder once every rank is done with it (every rank calls it)."""
        self.hvd.barrier()
        if self.hvd.rank() == 0:
            shutil.rmtree(self.folder, ignore_errors=True)

    def run(self, args: Sequence[str], timeout: float) -> dict[str, Any]:
        """The figures of ``script args --horovod-peer`` on as many Horovod ranks as this job
        has (or ``{"error": why}`` when it failed: the bench goes on without them)."""
        if not self.one_host:
            return {"error": "the Horovod peer runs on one host: run the bench on one host"}
        self.runs += 1
        done = self.folder / f"{self.runs}.json"
        if self.hvd.rank() == 0:
            try:
                result = run_horovod(self.python, self.script, args, timeout, np=self.hvd.size())
            except HorovodPeerFailed as failed:
                result = {"error": str(failed)}
            scratch = done.with_suffix(".tmp")
            scratch.write_text(json.dumps(result))
            scratch.replace(done)
            return result
        deadline = time.monotonic() + timeout + 60
        while not done.exists():
            if time.monotonic() > deadline:
                raise HorovodPeerFailed(f"rank 0's Horovod run wrote no {done} in time")
            time.sleep(0.05)
        return json.loads(done.read_text())
