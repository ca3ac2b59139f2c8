"""Warm start of :func:`kolo.spark.run`'s rank processes: the driver's knobs, and what a
barrier task does with them.

A barrier task looks for this executor's warm rank server (:mod:`kolo.spark._warm_server`):
one per (user, interpreter, kolo version and location, executor process), found in the 0700
directory ``$XDG_RUNTIME_DIR/kolo-warm-<uid>`` (else ``<tmp>/kolo-warm-<uid>``). When its
socket is there, the task starts the client (:mod:`kolo.spark._warm_client`) instead of a
fresh rank process; the client falls back to a fresh rank process by itself when the server
refuses. A task whose rank succeeded starts a server when none runs, importing the installed
modules that rank imported (it wrote them next to the socket). So an application's first
launch runs fresh rank processes and starts the servers; later launches are forked.

Knobs (read on the driver, like ``verbose``):

- ``KOLO_SPARK_WARM_START``: ``1`` (default) or ``0``; ``0`` starts every rank process fresh
  and starts no server.
- ``KOLO_SPARK_WARM_IDLE_SECONDS``: a server exits after this long with no rank and no
  request (default 300).

Example::

    options = warm_start_options()          # on the driver
    args, slot = rank_args(options, sys.executable, CHILD_CODE, launch_names)   # in a task
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from kolo.exceptions import ConfigError
from kolo.spark import _warm_client
from kolo.spark._warm_server import (
    FORK_UNSAFE,
    ServerConfig,
    lock_path,
    process_start_ticks,
    remove_key_files,
)

log = logging.getLogger("kolo.spark")

#: Turns warm start off (``0``) or on (``1``, the default).
WARM_START_VAR = "KOLO_SPARK_WARM_START"
#: Seconds a warm rank server waits idle before it exits.
IDLE_VAR = "KOLO_SPARK_WARM_IDLE_SECONDS"
DEFAULT_IDLE_S = 300.0
#: How the task starts a server: it detaches at once (the task does not wait for its imports).
SERVER_CODE = (
    "import os\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    "os.setsid()\n"
    "from kolo.spark._warm_server import main\n"
    "main()\n"
)
#: A key's files untouched this long with no server are removed (its executor is long gone).
STALE_KEY_S = 24 * 3600.0
#: The largest module list a task reads.
MAX_MODULES_BYTES = 64 << 10
#: How far up from the task's process the executor's JVM is looked for.
_MAX_ANCESTORS = 6


@dataclass(frozen=True)
class WarmStart:
    """The driver's warm-start settings, sent to every task."""

    enabled: bool
    idle_s: float


def warm_start_options(environ: Optional[Mapping[str, str]] = None) -> WarmStart:
    """The warm-start settings from ``KOLO_SPARK_WARM_START`` and
    ``KOLO_SPARK_WARM_IDLE_SECONDS``; ConfigError names a bad value.

    Example::

        warm_start_options({"KOLO_SPARK_WARM_START": "0"}).enabled   # False
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(WARM_START_VAR, "1").strip().lower()
    if raw in ("0", "false", "no", "off"):
        enabled = False
    elif raw in ("1", "true", "yes", "on", ""):
        enabled = True
    else:
        raise ConfigError(f"{WARM_START_VAR}={raw!r} must be 1 (warm start on) or 0 (off)")
    idle_text = environ.get(IDLE_VAR, "").strip()
    try:
        idle_s = float(idle_text) if idle_text else DEFAULT_IDLE_S
    except ValueError:
        idle_s = -1.0
    if not 0 < idle_s < 1e7:
        raise ConfigError(f"{IDLE_VAR}={idle_text!r} must be a positive number of seconds")
    return WarmStart(enabled=enabled, idle_s=idle_s)


def mentions_fork_unsafe(payload: bytes) -> Optional[str]:
    """The first name in a pickled payload that names a ``FORK_UNSAFE`` framework (its
    modules, globals and the names its code imports, e.g. ``tensorflow`` or
    ``kolo.spark.keras``), else None. Such a launch runs fresh rank processes: a rank forked
    from a server that imported torch must not load TensorFlow (the two abort a process
    together), and the server never imports those frameworks itself.

    Example::

        mentions_fork_unsafe(cloudpickle.dumps(lambda: __import__("tensorflow")))  # 'tensorflow'
    """
    import pickletools

    try:
        for _, arg, _ in pickletools.genops(payload):
            if isinstance(arg, str) and len(arg) < 256:
                parts = arg.split(".")
                if parts[0] in FORK_UNSAFE or (
                    parts[0] == "kolo" and any(part in FORK_UNSAFE for part in parts[1:])
                ):
                    return arg
    except Exception:  # not a pickle this scanner understands: do not fork for it
        return "an unreadable payload"
    return None


@dataclass(frozen=True)
class WarmSlot:
    """Where this executor's warm rank server for one interpreter lives."""

    directory: str
    key: str
    #: The executor process (pid, start ticks) the server outlives no longer than.
    watch: Optional[tuple[int, int]]

    @property
    def modules_path(self) -> str:
        return os.path.join(self.directory, self.key + ".modules.json")

    def listening(self) -> bool:
        """Whether a server published its socket and secret."""
        return os.path.exists(_warm_client.socket_path(self.directory, self.key)) and (
            os.path.exists(_warm_client.secret_path(self.directory, self.key))
        )

    def server_running(self) -> bool:
        """Whether a server holds this slot's lock (it may still be importing)."""
        try:
            fd = os.open(lock_path(self.directory, self.key), os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)  # releases the lock when this process took it
        return False


def private_directory() -> Optional[str]:
    """This user's 0700 directory for warm rank servers; None (warm start off, logged) when it
    cannot be made or is not safe (not a directory of this user with mode 0700)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or ""
    if not os.path.isdir(base):
        base = tempfile.gettempdir()
    path = os.path.join(base, f"kolo-warm-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        log.warning("kolo.spark.run: no warm start (cannot create %s: %s)", path, error)
        return None
    info = os.lstat(path)
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.getuid()
        or stat.S_IMODE(info.st_mode) & 0o077
    ):
        log.warning(
            "kolo.spark.run: no warm start: %s is not a directory of this user with mode 0700",
            path,
        )
        return None
    return path


def executor_process() -> Optional[tuple[int, int]]:
    """The executor's JVM (pid, start ticks): the nearest ``java`` ancestor of this process,
    else this process's parent."""
    pid = os.getpid()
    for _ in range(_MAX_ANCESTORS):
        try:
            with open(f"/proc/{pid}/stat", "rb") as file:
                text = file.read()
        except OSError:
            break
        comm = text[text.find(b"(") + 1 : text.rfind(b")")]
        if comm == b"java" and pid != os.getpid():
            ticks = process_start_ticks(pid)
            return (pid, ticks) if ticks is not None else None
        pid = int(text.rsplit(b")", 1)[1].split()[1])
        if pid <= 1:
            break
    parent = os.getppid()
    ticks = process_start_ticks(parent)
    return (parent, ticks) if ticks is not None else None


def warm_slot(program: str) -> Optional[WarmSlot]:
    """This executor's slot for rank processes of ``program``; None when warm start cannot run
    here."""
    return slot_for(program, executor_process())


def slot_for(program: str, watch: Optional[tuple[int, int]]) -> Optional[WarmSlot]:
    """The slot for rank processes of ``program`` on the executor process ``watch`` (pid,
    start ticks); None when this user has no safe directory for it.

    Example::

        slot = slot_for(sys.executable, (jvm_pid, process_start_ticks(jvm_pid)))
    """
    directory = private_directory()
    if directory is None:
        return None
    import kolo

    identity = "\0".join(
        [
            os.path.realpath(program),
            kolo.__version__,
            os.path.dirname(os.path.realpath(kolo.__file__)),
            str(os.getuid()),
            f"{watch[0]}:{watch[1]}" if watch else "",
        ]
    )
    key = hashlib.sha256(identity.encode()).hexdigest()[:24]
    return WarmSlot(directory=directory, key=key, watch=watch)


def rank_args(
    options: Optional[WarmStart], program: str, fresh_code: str, launch_names: list[str]
) -> tuple[list[str], Optional[WarmSlot]]:
    """The arguments of the task's rank process (after ``program``): the warm client when this
    executor's server listens, else a fresh rank process recording its modules; and the slot
    (None with warm start off).

    Example::

        args, slot = rank_args(WarmStart(True, 300.0), sys.executable, code, ["KOLO_RANK"])
    """
    slot = warm_slot(program) if options is not None and options.enabled else None
    if slot is None:
        return ["-c", fresh_code], None
    fresh = ["-c", fresh_code, slot.modules_path]
    if not slot.listening():
        return fresh, slot
    client = [
        "-I",
        "-S",
        "-c",
        client_source(),
        slot.directory,
        slot.key,
        ",".join(sorted(launch_names)),
    ]
    return client + fresh, slot


def sweep_stale_keys(directory: str, now: Optional[float] = None) -> None:
    """Removes the files of keys whose lock nobody holds and that nobody touched for
    ``STALE_KEY_S`` (servers of executors long gone that exited idle)."""
    now = time.time() if now is None else now
    for name in os.listdir(directory):
        if not name.endswith(".lock"):
            continue
        key = name[: -len(".lock")]
        slot = WarmSlot(directory=directory, key=key, watch=None)
        try:
            newest = max(
                os.stat(os.path.join(directory, key + suffix)).st_mtime
                for suffix in (".lock", ".log", ".modules.json")
                if os.path.exists(os.path.join(directory, key + suffix))
            )
        except (OSError, ValueError):
            continue
        if now - newest > STALE_KEY_S and not slot.server_running():
            remove_key_files(directory, key)


def client_source() -> str:
    """The client's program (this module's sibling ``_warm_client.py``, run with ``-c``)."""
    return Path(_warm_client.__file__).read_text(encoding="utf-8")


def start_server(
    slot: WarmSlot, options: WarmStart, program: str, env: dict[str, str], launch_names: list[str]
) -> None:
    """Starts this slot's server (detached) with ``env`` minus ``launch_names`` when none runs,
    importing the modules the last fresh rank recorded; problems are logged, never raised."""
    try:
        if slot.server_running():
            return
        sweep_stale_keys(slot.directory)
        modules: list[str] = []
        try:
            with open(slot.modules_path, "rb") as file:
                data = file.read(MAX_MODULES_BYTES + 1)
            if len(data) <= MAX_MODULES_BYTES:
                raw = json.loads(data)
                modules = [
                    m
                    for m in raw
                    if isinstance(m, str) and all(part.isidentifier() for part in m.split("."))
                ]
        except (OSError, ValueError, TypeError):
            pass
        config = ServerConfig(
            directory=slot.directory,
            key=slot.key,
            idle_s=options.idle_s,
            modules=modules,
            watch=slot.watch,
        )
        names = set(launch_names)
        server_env = {k: v for k, v in env.items() if k not in names}
        log_file = os.path.join(slot.directory, slot.key + ".log")
        fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "ab") as log_out:
            process = subprocess.Popen(
                [program, "-c", SERVER_CODE, config.to_json()],
                env=server_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_out,
                close_fds=True,
            )
        process.wait(timeout=30)
    except Exception as error:
        log.warning("kolo.spark.run: could not start a warm rank server: %s", error)
