"""Warm start of :func:`kolo.spark.run`'s rank processes: the driver's knobs, and what a
barrier task does with them.

A barrier task looks for this executor's warm rank server (:mod:`kolo.spark._warm_server`):
one per (user, interpreter, kolo version and location, executor JVM, PySpark daemon), found
in the 0700 directory ``$XDG_RUNTIME_DIR/kolo-warm-<uid>`` (else ``<tmp>/kolo-warm-<uid>``).
The PySpark daemon (the parent of the task's Python worker) belongs to one Spark application
(or Spark Connect session) and ends with it, so a server never outlives its application by
more than a second and a later application never finds an earlier one's server. When its
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
- ``KOLO_SPARK_WARM_DIR``: the directory of the servers' sockets and secrets instead of the
  default above (an absolute path; the executors create it, 0700, and refuse one that is not
  theirs with mode 0700). Tests give each module its own.

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
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from kolo.exceptions import ConfigError
from kolo.exceptions import TimeoutError as KoloTimeoutError
from kolo.spark import _warm_client
from kolo.spark._warm_server import (
    FORK_UNSAFE,
    ServerConfig,
    info_path,
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
#: The directory of the servers' sockets and secrets (default: see the module docs).
DIR_VAR = "KOLO_SPARK_WARM_DIR"
#: How often :func:`wait_for_server` looks.
_POLL_S = 0.05
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
    #: ``KOLO_SPARK_WARM_DIR`` (None: the default directory).
    directory: Optional[str] = None


def warm_start_options(environ: Optional[Mapping[str, str]] = None) -> WarmStart:
    """The warm-start settings from ``KOLO_SPARK_WARM_START``, ``KOLO_SPARK_WARM_IDLE_SECONDS``
    and ``KOLO_SPARK_WARM_DIR``; ConfigError names a bad value.

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
    directory = environ.get(DIR_VAR, "").strip() or None
    if directory is not None and not os.path.isabs(directory):
        raise ConfigError(
            f"{DIR_VAR}={directory!r} must be an absolute path (a directory the executors' "
            "user owns with mode 0700, or that they may create)"
        )
    return WarmStart(enabled=enabled, idle_s=idle_s, directory=directory)


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
    #: The processes (pid, start ticks) the server outlives no longer than: the PySpark
    #: daemon of the task's application and the executor's JVM.
    watch: tuple[tuple[int, int], ...]

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


def private_directory(path: Optional[str] = None) -> Optional[str]:
    """This user's 0700 directory for warm rank servers (``path``, else the default one);
    None (warm start off, logged) when it cannot be made or is not safe (not a directory of
    this user with mode 0700)."""
    if path is None:
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


def watched_processes() -> tuple[tuple[int, int], ...]:
    """What a server started by this task must not outlive, as (pid, start ticks): this
    process's parent (the PySpark daemon that forked this Python worker: one per Spark
    application or Spark Connect session, stopped with it; the JVM itself when Spark runs no
    daemon) and the executor's JVM (the nearest ``java`` ancestor)."""
    watched = []
    parent = os.getppid()
    ticks = process_start_ticks(parent)
    if ticks is not None:
        watched.append((parent, ticks))
    pid = parent
    for _ in range(_MAX_ANCESTORS):
        try:
            with open(f"/proc/{pid}/stat", "rb") as file:
                text = file.read()
        except OSError:
            break
        comm = text[text.find(b"(") + 1 : text.rfind(b")")]
        if comm == b"java":
            ticks = process_start_ticks(pid)
            if ticks is not None and (pid, ticks) not in watched:
                watched.append((pid, ticks))
            break
        pid = int(text.rsplit(b")", 1)[1].split()[1])
        if pid <= 1:
            break
    return tuple(watched)


def warm_slot(program: str, directory: Optional[str] = None) -> Optional[WarmSlot]:
    """This executor's slot for rank processes of ``program`` (in ``directory``, else the
    default one); None when warm start cannot run here."""
    return slot_for(program, watched_processes(), directory)


def slot_for(
    program: str, watch: tuple[tuple[int, int], ...], directory: Optional[str] = None
) -> Optional[WarmSlot]:
    """The slot for rank processes of ``program`` whose server watches the processes
    ``watch`` ((pid, start ticks), see :func:`watched_processes`), in ``directory`` (else the
    default one); None when this user has no safe directory for it. Other watched processes
    (another application's daemon) give another key.

    Example::

        slot = slot_for(sys.executable, ((daemon, daemon_ticks), (jvm, jvm_ticks)))
    """
    directory = private_directory(directory)
    if directory is None:
        return None
    import kolo

    identity = "\0".join(
        [
            os.path.realpath(program),
            kolo.__version__,
            os.path.dirname(os.path.realpath(kolo.__file__)),
            str(os.getuid()),
            ",".join(f"{pid}:{ticks}" for pid, ticks in watch),
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
    slot = None
    if options is not None and options.enabled:
        slot = warm_slot(program, options.directory)
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
        slot = WarmSlot(directory=directory, key=key, watch=())
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


def server_info(slot: WarmSlot) -> Optional[dict]:
    """The description of the server that serves ``slot`` now (its pid, start ticks,
    modules), or None when none does: its socket, secret and description are all there and
    the process they name still runs (a server that exited or retired removed them; one
    killed outright left them behind for a process that is gone)."""
    if not slot.listening():
        return None
    try:
        with open(info_path(slot.directory, slot.key), "rb") as file:
            info = json.loads(file.read(MAX_MODULES_BYTES))
        pid, ticks = int(info["pid"]), int(info["ticks"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if process_start_ticks(pid) != ticks or not slot.listening():
        return None
    return info


def serving(directory: str) -> list[tuple[WarmSlot, dict]]:
    """Every server that serves in ``directory`` now, with its description (see
    :func:`server_info`), by key."""
    found = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    for name in names:
        if name.endswith(".sock"):
            slot = WarmSlot(directory=directory, key=name[: -len(".sock")], watch=())
            info = server_info(slot)
            if info is not None:
                found.append((slot, info))
    return found


def wait_for_server(directory: str, timeout_s: float) -> tuple[WarmSlot, dict]:
    """Waits until exactly one server serves in ``directory`` (a directory of its own, e.g.
    ``KOLO_SPARK_WARM_DIR`` of a test or bench on one executor) and returns its slot and
    description. A server replaced meanwhile (one retired, another of the same key started)
    is no obstacle: the answer is whichever serves when the wait ends. Raises
    :class:`kolo.exceptions.TimeoutError` after ``timeout_s``, with the servers' logs.

    Example::

        slot, info = wait_for_server(directory, 60.0)
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found = serving(directory)
        if len(found) == 1:
            return found[0]
        if time.monotonic() >= deadline:
            logs = sorted(Path(directory).glob("*.log")) if os.path.isdir(directory) else []
            text = "; ".join(f"{log.name}: {_log_tail(str(log))}" for log in logs) or "no log"
            raise KoloTimeoutError(
                f"{len(found)} warm rank servers serve in {directory} after {timeout_s:g} s "
                f"(waited for exactly one); {text}"
            )
        time.sleep(_POLL_S)


def stop_server(slot: WarmSlot, timeout_s: float) -> bool:
    """Stops the server that serves ``slot`` (SIGTERM: it kills the ranks it forked and
    removes its files) and waits for it to exit; True when one was stopped. Raises
    :class:`kolo.exceptions.TimeoutError` when it still runs after ``timeout_s``.

    Example::

        for slot, _ in serving(directory):
            stop_server(slot, 10.0)
    """
    info = server_info(slot)
    if info is None:
        return False
    pid, ticks = int(info["pid"]), int(info["ticks"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout_s
    while process_start_ticks(pid) == ticks:
        if time.monotonic() >= deadline:
            raise KoloTimeoutError(
                f"the warm rank server {pid} still runs {timeout_s:g} s after SIGTERM"
            )
        time.sleep(_POLL_S)
    return True


def _log_tail(path: str, size: int = 2048) -> str:
    try:
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(0, file.tell() - size))
            return file.read().decode(errors="replace").strip() or "(empty)"
    except OSError:
        return "(unreadable)"
