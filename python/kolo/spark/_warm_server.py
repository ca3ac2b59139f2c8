"""A warm rank server (a "zygote") for the rank processes of :func:`kolo.spark.run` on one
executor: it imports kolo and the installed modules the executor's previous rank imported
(:func:`kolo._rank_process.third_party_modules`, minus ``FORK_UNSAFE``),
then forks a rank process for each authenticated request, so a later launch's ranks skip the
interpreter's start and ``import torch``.

A barrier task starts it (:mod:`kolo.spark._warm_start`) after its rank process succeeded,
as ``python -c SERVER_CODE CONFIG`` with the environment that rank had minus the launch's own
variables. It detaches (its own session), takes ``DIR/KEY.lock`` (one server per key), imports,
writes its secret (``DIR/KEY.secret``, 0600) and listens on ``DIR/KEY.sock`` (0600, in the
0700 directory ``DIR``).

A request (:mod:`kolo.spark._warm_client`) is accepted only from a peer of this uid
(``SO_PEERCRED``) that proves it knows the secret (HMAC-SHA256 over a fresh nonce and the
request; compared in constant time before the JSON body is parsed), carries three file
descriptors, and fits ``MAX_REQUEST_BYTES``. It is refused, and the client starts a fresh
rank process instead, when: the interpreter differs; the environment differs in anything
but the launch's own ``KOLO_*``/``HOROVOD_*`` variables; a module file this server loaded
changed on disk (kolo upgraded or edited, a package reinstalled); CUDA was initialised here;
or a thread was started since the imports. The only threads tolerated are unnamed native
threads the imports themselves started (OpenBLAS's pool, which quiesces itself around
``fork``); a server whose imports started named threads (a runtime such as tokio, gRPC or
TensorFlow's) or loaded ``FORK_UNSAFE`` modules does not serve at all. A
refusal for a stale environment or stale files also retires the server: its socket, secret,
description and lock go at once (so a later task starts a matching server of the same key
while this one still waits for the ranks it forked) and it exits when those ranks ended.

The forked rank process takes over the client's stdin/stdout/stderr, environment, working
directory, umask, resource limits and ignored signals, leads its own session (the client
forwards signals to it), dies with the server (``PR_SET_PDEATHSIG``), reseeds ``random`` and
NumPy's global generator, and runs :func:`kolo._rank_process.rank_main` as a fresh rank
process would. The server reports its exit status to the client, kills what the rank left in
its process group, and kills the rank if the client's connection closes first (the task
killed the client). It exits after ``idle_s`` without a rank or a request, on SIGTERM, and
when a process it watches is gone (the executor's JVM, or the PySpark daemon of the Spark
application whose tasks started it: the application or session ended), killing its ranks.

Example::

    python -c "from kolo.spark._warm_server import main; main()" '{"dir": ..., "key": ...}'
"""

from __future__ import annotations

import ctypes
import fcntl
import hmac
import importlib
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, TextIO

from kolo.spark._warm_client import (
    MAC_BYTES,
    MAGIC,
    MAX_REQUEST_BYTES,
    NONCE_BYTES,
    RLIMIT_NAMES,
    recv_exactly,
    request_mac,
    secret_path,
    send_message,
    socket_path,
)

#: How long a connection may take to authenticate and send its request.
AUTH_TIMEOUT_S = 2.0
#: How often the server checks its idle time and the executor it watches.
TICK_S = 1.0
#: Launch variables a request may leave out of the environment comparison start with these.
LAUNCH_PREFIXES = ("KOLO_", "HOROVOD_")
#: Variables that name a process, a session or a shell's state rather than configure what the
#: server imported; they differ between launches of one application (``SparkBackend`` copies
#: the driver's ``os.environ``, pytest sets ``PYTEST_CURRENT_TEST`` per test) and are left out
#: of the environment comparison. A forked rank still gets the request's values of them.
PER_PROCESS_VARIABLES = frozenset(
    {
        # shells
        "_",
        "OLDPWD",
        "PWD",
        "SHLVL",
        "COLUMNS",
        "LINES",
        # test runners
        "PYTEST_CURRENT_TEST",
        "PYTEST_XDIST_WORKER",
        # Spark's Python workers: the worker factory's connection and secret, the session's
        # identity and its scratch directories (one daemon per factory: see _warm_start)
        "PYTHON_WORKER_FACTORY_SECRET",
        "PYTHON_WORKER_FACTORY_PORT",
        "PYTHON_WORKER_FACTORY_SOCK_DIR",
        "PYTHON_WORKER_FACTORY_SOCK_PATH",
        "SPARK_JOB_ARTIFACT_UUID",
        "PYSPARK_SPARK_SESSION_UUID",
        "SPARK_LOCAL_DIRS",
        # the PySpark driver's gateway to its JVM (in a driver's copied environment)
        "PYSPARK_GATEWAY_PORT",
        "PYSPARK_GATEWAY_SECRET",
    }
)
_PR_SET_PDEATHSIG = 1


def environment_differences(
    ours: dict[str, str], theirs: dict[str, str], launch_names: list[str]
) -> list[str]:
    """The variables whose values differ between the server's environment and a request's
    (sorted), leaving out :data:`PER_PROCESS_VARIABLES` and the launch's own variables
    (``launch_names`` that start with ``KOLO_``/``HOROVOD_``). Everything else counts,
    whatever its name: ``PATH``, ``PYTHONPATH``, ``LD_LIBRARY_PATH``, ``CUDA_VISIBLE_DEVICES``,
    a user's ``KOLO_*`` knob, ``OMP_NUM_THREADS`` may all change what an import did.

    Example::

        environment_differences({"PATH": "/a", "_": "x"}, {"PATH": "/a", "_": "y"}, [])  # []
    """
    skip = PER_PROCESS_VARIABLES | {
        name for name in launch_names if isinstance(name, str) and name.startswith(LAUNCH_PREFIXES)
    }
    names = (set(ours) | set(theirs)) - skip
    return sorted(name for name in names if ours.get(name) != theirs.get(name))


def lock_path(directory: str, key: str) -> str:
    """The file a running server holds locked."""
    return os.path.join(directory, key + ".lock")


def info_path(directory: str, key: str) -> str:
    """The server's description (pid, modules, versions), JSON."""
    return os.path.join(directory, key + ".json")


def log_path(directory: str, key: str) -> str:
    """The server's log (why it refused a request)."""
    return os.path.join(directory, key + ".log")


def own_files(directory: str, key: str) -> list[str]:
    """The files a serving server publishes (and removes when it retires or exits)."""
    return [socket_path(directory, key), secret_path(directory, key), info_path(directory, key)]


def key_files(directory: str, key: str) -> list[str]:
    """Every file of ``key`` in ``directory`` (its lock last)."""
    names = (".sock", ".secret", ".json", ".log", ".modules.json", ".lock")
    return [os.path.join(directory, key + suffix) for suffix in names]


def remove_key_files(directory: str, key: str) -> None:
    """Removes ``key``'s files (once no server can use the key again)."""
    for path in key_files(directory, key):
        try:
            os.unlink(path)
        except OSError:
            pass


@dataclass
class ServerConfig:
    """What the task tells a server: where it lives, what it imports, what it watches."""

    directory: str
    key: str
    idle_s: float
    modules: list[str]
    #: The processes (pid, start time in clock ticks) any of whose end ends the server.
    watch: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {
                "dir": self.directory,
                "key": self.key,
                "idle_s": self.idle_s,
                "modules": self.modules,
                "watch": [list(process) for process in self.watch],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> ServerConfig:
        raw = json.loads(text)
        return cls(
            directory=str(raw["dir"]),
            key=str(raw["key"]),
            idle_s=float(raw["idle_s"]),
            modules=[str(name) for name in raw.get("modules", [])],
            watch=tuple((int(pid), int(ticks)) for pid, ticks in raw.get("watch") or ()),
        )


def process_start_ticks(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot); None when it does not exist or
    has exited (a zombie its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return None if fields[0] in (b"Z", b"X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def os_thread_count() -> int:
    """The number of threads of this process."""
    return len(os.listdir("/proc/self/task"))


@dataclass
class _Rank:
    """A forked rank process and the client waiting for it."""

    pid: int
    conn: socket.socket


@dataclass
class _Server:
    config: ServerConfig
    log: TextIO
    listener: socket.socket
    wake: tuple[int, int]
    lock: int
    secret: bytes
    env: dict[str, str]
    stamps: dict[str, tuple[int, int]]
    threads: int
    ranks: dict[int, _Rank] = field(default_factory=dict)
    last_active: float = field(default_factory=time.monotonic)
    #: Stale (a refusal that ends the server): no new requests; exit once the ranks ended.
    retiring: bool = False
    #: A watched process ended: this key is never used again, so its files all go.
    executor_gone: bool = False
    #: SIGTERM arrived: exit (killing the ranks) at the next turn of the loop.
    stopping: bool = False

    def note(self, text: str) -> None:
        self.log.write(f"{time.strftime('%H:%M:%S')} [{os.getpid()}] {text}\n")
        self.log.flush()

    def serve(self) -> Optional[dict]:
        """Runs until the server should end (returns None) or, in a forked rank process,
        returns the request the rank runs."""
        while True:
            conns = [rank.conn for rank in self.ranks.values()]
            listening = [] if self.retiring else [self.listener]
            readable, _, _ = select.select([*listening, self.wake[0], *conns], [], [], TICK_S)
            if self.wake[0] in readable:
                try:
                    os.read(self.wake[0], 512)
                except BlockingIOError:
                    pass
            self.reap()
            for rank in list(self.ranks.values()):
                if rank.conn in readable and not _peek_open(rank.conn):
                    self.note(f"the client of rank process {rank.pid} is gone: killing it")
                    _kill_group(rank.pid, signal.SIGKILL)
            if self.retiring and not self.ranks:
                return None
            if self.listener in readable:
                try:
                    conn, _ = self.listener.accept()
                except OSError:
                    conn = None
                if conn is not None:
                    self.last_active = time.monotonic()
                    outcome = self.handle(conn)
                    if outcome is not None:
                        return outcome
            if self.stopping:
                self.note("stopped (SIGTERM): exiting")
                return None
            for pid, ticks in self.config.watch:
                if process_start_ticks(pid) != ticks:
                    self.note(f"the watched process {pid} is gone: exiting")
                    self.executor_gone = True
                    return None
            if self.ranks:
                self.last_active = time.monotonic()
            elif time.monotonic() - self.last_active >= self.config.idle_s:
                self.note(f"idle for {self.config.idle_s:g} s: exiting")
                return None

    def retire(self) -> None:
        """Stops taking requests: the socket, secret and description go and the lock is
        released at once, so no task finds this server again and a replacement of the same key
        can start (and publish its own files, which this server then leaves alone) while the
        ranks this one forked run to their end."""
        if self.retiring:
            return
        self.retiring = True
        for path in own_files(self.config.directory, self.config.key):
            try:
                os.unlink(path)
            except OSError:
                pass
        self.listener.close()
        os.close(self.lock)
        self.lock = -1
        if self.ranks:
            self.note(f"retiring: waiting for {len(self.ranks)} rank process(es) to end")

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rank = self.ranks.pop(pid, None)
            _kill_group(pid, signal.SIGKILL)  # what the rank left behind in its group
            if rank is not None:
                try:
                    send_message(rank.conn, {"status": status})
                except OSError:
                    pass
                rank.conn.close()

    def handle(self, conn: socket.socket) -> Optional[dict]:
        """Authenticates and checks one request; forks for it (or refuses it, retiring when
        the refusal says this server is stale). Returns the request in the forked rank
        process, else None."""
        fds: list[int] = []
        try:
            conn.settimeout(AUTH_TIMEOUT_S)
            _, uid, _ = struct.unpack(
                "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            )
            if uid != os.getuid():
                self.note(f"refused a connection from uid {uid}")
                conn.close()
                return None
            nonce = os.urandom(NONCE_BYTES)
            conn.sendall(MAGIC + nonce)
            head, fds, _, _ = socket.recv_fds(conn, 4, 3)
            if len(head) < 4:
                head += recv_exactly(conn, 4 - len(head))
            (size,) = struct.unpack("!I", head)
            if size > MAX_REQUEST_BYTES:
                raise ValueError(f"a request of {size} bytes is over the limit")
            rest = recv_exactly(conn, size + MAC_BYTES)
            body, mac = rest[:size], rest[size:]
            if not hmac.compare_digest(mac, request_mac(self.secret, nonce, body)):
                raise PermissionError("the request's authentication is wrong")
            if len(fds) != 3:
                raise ValueError(f"the request carries {len(fds)} file descriptors, not 3")
            request = json.loads(body)
            if not isinstance(request, dict):
                raise ValueError("the request is not a JSON object")
        except (OSError, ValueError, struct.error) as error:
            self.note(f"refused a request: {error}")
            _close_all(fds)
            conn.close()
            return None
        try:
            reason, fatal = self.refusal(request)
        except Exception as error:  # a field of the wrong shape
            reason, fatal = f"a malformed request ({type(error).__name__}: {error})", False
        if reason is not None:
            self.note(f"refused a request: {reason}")
            _close_all(fds)
            if fatal:
                # Before the answer: whoever hears it finds no stale server left to ask.
                self.retire()
            try:
                send_message(conn, {"ok": False, "reason": reason})
            except OSError:
                pass
            conn.close()
            return None
        forked = time.time()
        pid = os.fork()
        if pid == 0:
            conn.close()
            self.become_rank(request, fds)
            request["forked"] = forked
            return request
        _close_all(fds)
        conn.settimeout(None)
        self.ranks[pid] = _Rank(pid, conn)
        try:
            send_message(conn, {"ok": True, "pid": pid})
        except OSError:
            _kill_group(pid, signal.SIGKILL)
        self.note(f"forked rank process {pid}")
        return None

    def refusal(self, request: dict) -> tuple[Optional[str], bool]:
        """Why the request cannot be served (and whether that ends the server), or None."""
        if request.get("executable") != os.path.realpath(sys.executable):
            return f"the interpreter {request.get('executable')!r} is not this server's", False
        if request.get("version") != sys.version:
            return "the Python version is not this server's", False
        env, names = request.get("env"), request.get("launch_names")
        if not isinstance(env, dict) or not isinstance(names, list):
            return "the request has no environment", False
        changed = environment_differences(self.env, env, names)
        if changed:
            return f"the environment changed ({', '.join(changed)})", True
        for path, stamp in self.stamps.items():
            try:
                now = os.stat(path)
            except OSError:
                return f"{path} is gone", True
            if (now.st_mtime_ns, now.st_size) != stamp:
                return f"{path} changed on disk", True
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            return "CUDA was initialised in the server", True
        if threading.active_count() != 1 or os_thread_count() != self.threads:
            return "the server started threads since its imports: fork is unsafe", True
        cwd = request.get("cwd")
        if not isinstance(cwd, str) or not os.path.isdir(cwd):
            return f"the working directory {cwd!r} does not exist", False
        for name, (_soft, hard) in dict(request.get("rlimits") or {}).items():
            if name not in RLIMIT_NAMES or not hasattr(resource, name):
                return f"unknown resource limit {name}", False
            _, our_hard = resource.getrlimit(getattr(resource, name))
            if _limit(hard) > _limit(our_hard):
                return f"{name} hard limit {hard} is above the server's {our_hard}", False
        return None, False

    def become_rank(self, request: dict, fds: list[int]) -> None:
        """In the forked process: take over the client's setup (see the module docs)."""
        try:
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            _close_all([fd for fd in fds if fd > 2])
            signal.set_wakeup_fd(-1)
            os.close(self.wake[0])
            os.close(self.wake[1])
            self.listener.close()
            if self.lock >= 0:
                os.close(self.lock)  # the server's lock must end with the server
            for rank in self.ranks.values():
                rank.conn.close()
            self.log.close()
            os.setsid()
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
            _restore_signals(set(request.get("ignored_signals") or ()))
            os.umask(int(request["umask"]))
            for name, (soft, hard) in dict(request.get("rlimits") or {}).items():
                resource.setrlimit(getattr(resource, name), (soft, hard))
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in request["env"].items()})
            os.chdir(request["cwd"])
            sys.argv = ["-c"]
            # Directory listings the server's imports cached (e.g. of a PYTHONPATH entry) may
            # predate the user's edits: the rank looks again, as a fresh process does.
            importlib.invalidate_caches()
            numpy_random = sys.modules.get("numpy.random")
            if numpy_random is not None:
                numpy_random.seed()
        except BaseException as error:
            os.write(
                2, f"kolo.spark.run: the warm rank process could not start: {error}\n".encode()
            )
            os._exit(1)


def _limit(value: int) -> float:
    return float("inf") if value == resource.RLIM_INFINITY or value < 0 else float(value)


def _restore_signals(ignored: set[int]) -> None:
    """The signal dispositions a fresh Python started with ``ignored`` ignored has."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            if signum in ignored:
                signal.signal(signum, signal.SIG_IGN)
            elif signum == signal.SIGINT:
                signal.signal(signum, signal.default_int_handler)
            elif signum in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(signum, signal.SIG_IGN)
            else:
                signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):
            pass


def _peek_open(conn: socket.socket) -> bool:
    """Whether a readable client connection is still open (it never sends after its request)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def _kill_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except OSError:
        pass


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


#: Modules a server never imports: they start threads or state that do not survive ``fork``
#: (TensorFlow's and JAX's runtimes); a rank that needs them imports them itself. kolo's
#: adapters for them are left out too.
FORK_UNSAFE = ("tensorflow", "jax", "jaxlib", "keras", "tf_keras")


def _fork_unsafe(name: str) -> bool:
    parts = name.split(".")
    if parts[0] == "kolo":
        return any(part in FORK_UNSAFE for part in parts[1:])
    return parts[0] in FORK_UNSAFE


def _preimport(names: list[str], log: TextIO) -> dict[str, str]:
    """Imports kolo's rank process and, in order, kolo's modules and the installed
    distributions' top-level modules among ``names`` (not ``FORK_UNSAFE``); returns
    ``{module: "distribution version"}`` of those imported."""
    from importlib import metadata

    import kolo
    import kolo._rank_process

    by_module = metadata.packages_distributions()
    imported = {}
    for name in names:
        kolo_module = name.startswith("kolo.")
        dists = ["kolo"] if kolo_module else by_module.get(name)
        if not dists or _fork_unsafe(name) or name in sys.builtin_module_names:
            continue
        if not kolo_module and "." in name:
            continue
        try:
            importlib.import_module(name)
        except BaseException as error:  # a module that cannot load alone is left to the rank
            log.write(f"not pre-importing {name}: {type(error).__name__}: {error}\n")
            continue
        if kolo_module:
            imported[name] = f"kolo {kolo.__version__}"
            continue
        try:
            imported[name] = f"{dists[0]} {metadata.version(dists[0])}"
        except metadata.PackageNotFoundError:
            imported[name] = dists[0]
    unsafe = sorted(name for name in sys.modules if _fork_unsafe(name) and "." not in name)
    if unsafe:
        raise RuntimeError(f"the imports loaded fork-unsafe modules {unsafe}")
    return imported


def _named_threads() -> list[str]:
    """The names of this process's threads other than the main thread's own name. Thread
    pools that quiesce around ``fork`` (OpenBLAS, MKL) keep the process's name; runtimes that
    do not (tokio, gRPC, TensorFlow) name their threads."""
    main = Path("/proc/self/comm").read_text().strip()
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{task}/comm").read_text().strip()
        except OSError:
            continue
        if name != main:
            names.append(name)
    return sorted(names)


def _stamps() -> dict[str, tuple[int, int]]:
    """``(mtime_ns, size)`` of every module file loaded now."""
    stamps = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path not in stamps:
            try:
                st = os.stat(path)
            except OSError:
                continue
            stamps[path] = (st.st_mtime_ns, st.st_size)
    return stamps


def _write_private(path: str, data: bytes) -> None:
    """Writes ``path`` (0600) atomically."""
    temp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(temp, path)


def main() -> None:
    """The server's process (``sys.argv[1]`` is its :class:`ServerConfig` as JSON)."""
    config = ServerConfig.from_json(sys.argv[1])
    directory, key = config.directory, config.key
    lock = os.open(lock_path(directory, key), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another server of this key runs
    log = open(log_path(directory, key), "a", encoding="utf-8")
    env = dict(os.environ)
    started = time.time()
    try:
        modules = _preimport(config.modules, log)
    except RuntimeError as error:
        log.write(f"not serving: {error}\n")
        return
    named = _named_threads()
    if named:
        log.write(
            f"not serving: the imports started named threads {named} (a runtime that "
            "does not survive fork)\n"
        )
        return
    secret = os.urandom(32)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock = socket_path(directory, key)
    try:
        os.unlink(sock)
    except FileNotFoundError:
        pass
    old_umask = os.umask(0o177)
    try:
        listener.bind(sock)
    finally:
        os.umask(old_umask)
    listener.listen(64)
    _write_private(secret_path(directory, key), secret)
    wake = os.pipe()
    os.set_blocking(wake[0], False)
    os.set_blocking(wake[1], False)
    signal.set_wakeup_fd(wake[1], warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    server = _Server(
        config=config,
        log=log,
        listener=listener,
        wake=wake,
        lock=lock,
        secret=secret,
        env=env,
        stamps=_stamps(),
        threads=os_thread_count(),
    )

    def stop(_signum: int, _frame: object) -> None:
        server.stopping = True

    signal.signal(signal.SIGTERM, stop)
    info = {
        "pid": os.getpid(),
        "ticks": process_start_ticks(os.getpid()),
        "modules": modules,
        "import_seconds": round(time.time() - started, 3),
        "threads": server.threads,
    }
    _write_private(info_path(directory, key), json.dumps(info).encode())
    server.note(f"serving {sock}; pre-imported {sorted(modules)} in {info['import_seconds']} s")
    me = os.getpid()
    request = None
    try:
        request = server.serve()
    finally:
        if os.getpid() == me:
            if not server.retiring:  # a retired server's files may be its replacement's now
                for path in own_files(directory, key):
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
            for rank in server.ranks.values():
                _kill_group(rank.pid, signal.SIGKILL)
            log.close()
            if server.executor_gone and not server.retiring:
                remove_key_files(directory, key)
    if request is None:
        return
    from kolo._rank_process import rank_main

    rank_main(
        "kolo.spark.run",
        interpreter_unix=request.get("interpreter"),
        start_times={"process": request.get("process"), "forked": request["forked"]},
    )
