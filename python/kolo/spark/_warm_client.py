"""The client side of a warm rank server (:mod:`kolo.spark._warm_server`), and the protocol
both sides share. Standard library only: a barrier task runs this file's source as
``python -I -S -c SOURCE DIR KEY LAUNCH_NAMES -c FRESH_CODE [FRESH_ARGS...]`` (isolated,
no ``site``: the client needs nothing but the standard library) so that the process
the task supervises starts in milliseconds without importing kolo.

The client connects to the server's Unix socket ``DIR/KEY.sock`` (``DIR`` is a 0700
directory of this user), proves it knows the server's secret (``DIR/KEY.secret``, 0600) with
an HMAC-SHA256 over the server's fresh nonce and the request, and hands over its stdin, stdout
and stderr (``SCM_RIGHTS``). The request is JSON (never a pickle) of bounded size: the
interpreter, its environment, working directory, umask and resource limits, and when this
process started. The server forks a rank process that takes those over and runs the rank;
the client waits for its exit status and ends the same way (exit code or signal), forwarding
SIGTERM/SIGINT/SIGHUP/SIGQUIT to the rank's process group meanwhile. If the client is killed
(SIGKILL), the server sees its connection close and kills the rank.

When the server is missing, refuses (another interpreter, a changed environment, a changed
module file on disk, unsafe to fork) or fails, the client replaces itself with a fresh rank
process (``exec`` of this interpreter with ``FRESH_CODE``): the task then supervises exactly
what it would have started without a warm server.

Example::

    args = ["-c", client_source(), str(directory), key, "KOLO_RANK", "-c", fresh_code]
"""

from __future__ import annotations

import _signal as signal  # not `signal`/`socket`: their enum imports cost the client ~30 ms
import _socket as socket
import hashlib
import hmac
import json
import os
import struct
import sys
import time

#: What the server sends first (then a nonce); a client of another protocol stops there.
MAGIC = b"kolo-warm-rank-server 1\n"
#: Length of the server's nonce.
NONCE_BYTES = 32
#: Length of the request's HMAC-SHA256.
MAC_BYTES = 32
#: The largest request a server reads (the environment is most of it).
MAX_REQUEST_BYTES = 1 << 20
#: The largest reply either side reads.
MAX_REPLY_BYTES = 64 << 10
#: How long the client waits for the server to accept and answer a request.
REQUEST_TIMEOUT_S = 5.0
#: Signals the client passes on to the rank's process group.
FORWARDED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
#: ``resource`` limit names a request carries (those that exist on this platform).
RLIMIT_NAMES = (
    "RLIMIT_AS",
    "RLIMIT_CORE",
    "RLIMIT_CPU",
    "RLIMIT_DATA",
    "RLIMIT_FSIZE",
    "RLIMIT_MEMLOCK",
    "RLIMIT_NOFILE",
    "RLIMIT_NPROC",
    "RLIMIT_STACK",
)


def socket_path(directory: str, key: str) -> str:
    """The server's socket for ``key``."""
    return os.path.join(directory, key + ".sock")


def secret_path(directory: str, key: str) -> str:
    """The file holding the server's secret (0600)."""
    return os.path.join(directory, key + ".secret")


def request_mac(secret: bytes, nonce: bytes, body: bytes) -> bytes:
    """The HMAC-SHA256 a request carries: over the magic, the server's nonce and the body."""
    return hmac.new(secret, MAGIC + nonce + body, hashlib.sha256).digest()


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``sock``; ConnectionError when it closes first."""
    chunks = []
    while size > 0:
        chunk = sock.recv(min(size, 1 << 16))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def send_message(sock: socket.socket, obj: object) -> None:
    """A length-prefixed JSON message."""
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def recv_message(sock: socket.socket) -> object:
    """A length-prefixed JSON message of at most ``MAX_REPLY_BYTES``."""
    (size,) = struct.unpack("!I", recv_exactly(sock, 4))
    if size > MAX_REPLY_BYTES:
        raise ConnectionError(f"a message of {size} bytes is over the limit")
    return json.loads(recv_exactly(sock, size))


def process_started_unix() -> float | None:
    """When this process was created (as :func:`kolo._launch_times.process_started_unix`)."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])
        boot_now = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.time() - (boot_now - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def build_request(launch_names: list[str], interpreter_unix: float) -> dict:
    """What this process asks the server for: a rank process set up as this one is."""
    import resource

    umask = os.umask(0o022)
    os.umask(umask)
    limits = {}
    for name in RLIMIT_NAMES:
        if hasattr(resource, name):
            limits[name] = list(resource.getrlimit(getattr(resource, name)))
    return {
        "executable": os.path.realpath(sys.executable),
        "version": sys.version,
        "env": dict(os.environ),
        "launch_names": launch_names,
        "cwd": os.getcwd(),
        "umask": umask,
        "rlimits": limits,
        "ignored_signals": [
            int(s) for s in signal.valid_signals() if signal.getsignal(s) == signal.SIG_IGN
        ],
        "process": process_started_unix(),
        "interpreter": interpreter_unix,
    }


def ask_server(directory: str, key: str, request: dict) -> tuple[socket.socket, int]:
    """Sends ``request`` with this process's stdin/stdout/stderr; returns the connection and
    the rank process's pid. Raises OSError/ConnectionError/ValueError when the server is
    missing or refuses (its reason in the message)."""
    with open(secret_path(directory, key), "rb") as file:
        secret = file.read(64)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(REQUEST_TIMEOUT_S)
        sock.connect(socket_path(directory, key))
        greeting = recv_exactly(sock, len(MAGIC) + NONCE_BYTES)
        if not greeting.startswith(MAGIC):
            raise ConnectionError("the socket's server speaks another protocol")
        nonce = greeting[len(MAGIC) :]
        body = json.dumps(request).encode()
        if len(body) > MAX_REQUEST_BYTES:
            raise ValueError(f"the request is {len(body)} bytes, over {MAX_REQUEST_BYTES}")
        message = struct.pack("!I", len(body)) + body + request_mac(secret, nonce, body)
        rights = struct.pack("3i", 0, 1, 2)
        sent = sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
        if sent < len(message):
            sock.sendall(message[sent:])
        reply = recv_message(sock)
        if not isinstance(reply, dict) or not reply.get("ok"):
            reason = reply.get("reason") if isinstance(reply, dict) else reply
            raise ConnectionError(f"the warm rank server refused: {reason}")
        pid = int(reply["pid"])
        sock.settimeout(None)
        return sock, pid
    except BaseException:
        sock.close()
        raise


def wait_for_rank(sock: socket.socket, pid: int) -> None:
    """Forwards signals to the rank's group until the server reports its exit, then ends
    this process the same way (never returns)."""

    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(pid, signum)
        except OSError:
            pass

    for name in FORWARDED_SIGNALS:
        signal.signal(getattr(signal, name), forward)
    try:
        reply = recv_message(sock)
        status = int(reply["status"]) if isinstance(reply, dict) else -1
    except (OSError, ValueError, KeyError, TypeError):
        status = -1
    if status < 0:
        # The server died: nobody reports the rank's exit any more, so it must not run on.
        forward(signal.SIGKILL, None)
        os.write(2, b"kolo.spark.run: the warm rank server ended while its rank ran\n")
        os._exit(1)
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum != signal.SIGKILL:
            signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main(argv: list[str]) -> None:
    """``argv``: ``[-c, DIR, KEY, LAUNCH_NAMES, -c, FRESH_CODE, *FRESH_ARGS]`` (see the module
    docs)."""
    started = time.time()
    directory, key, names = argv[1], argv[2], argv[3]
    fresh = argv[4:]
    try:
        request = build_request([n for n in names.split(",") if n], started)
        sock, pid = ask_server(directory, key, request)
    except Exception:
        # The server's log (DIR/KEY.log) says why it refused.
        os.execv(sys.executable, [sys.executable, *fresh])
    wait_for_rank(sock, pid)


if __name__ == "__main__" and len(sys.argv) > 4 and sys.argv[0] == "-c":
    main(sys.argv)
