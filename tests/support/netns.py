"""Real hosts out of Linux namespaces: each host is a network + UTS + mount namespace with its own
hostname, its own veth link (``eth0``) to a bridge, its own address in 10.231.0.0/24, its own
``/etc/hosts`` naming every host, and (when asked) its own sshd on port 22.

The bridge lives in a fourth "switch" namespace, so nothing is added to the machine's own network
stack: no address, no route, no NAT; traffic stays between these namespaces (and their loopback).
Each namespace is held open by a ``sleep`` process started with ``unshare`` that dies with the
Python process that made it; :meth:`Cluster.close` kills every process left in the namespaces.

Example::

    with Cluster.create(tmp_path, ["hosta", "hostb", "hostc"]) as cluster:
        cluster.start_sshd()
        cluster["hostb"].run(["hostname"]).stdout  # 'hostb\\n'
        cluster.cut("hostb")                       # its link goes down on the switch
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

SUBNET = "10.231.0"
PREFIX = 24
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def unavailable_reason() -> Optional[str]:
    """Why namespaces cannot be built on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    for tool in ("ip", "unshare", "nsenter", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} not found (install iproute2 and util-linux)"
    sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
    if sshd is None:
        return "sshd not found (install openssh-server)"
    probe = subprocess.run(
        ["unshare", "--net", "--uts", "--mount", "sh", "-c", "ip link add kolo-p0 type bridge"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"cannot create a network namespace with a bridge: {probe.stderr.strip()}"
    return None


def qdisc_available(kind: str) -> bool:
    """True when the kernel has the ``kind`` queueing discipline (e.g. ``netem``)."""
    probe = subprocess.run(
        [
            "unshare",
            "--net",
            "sh",
            "-c",
            "ip link add kolo-q0 type veth peer name kolo-q1 && "
            f"tc qdisc add dev kolo-q0 root {kind}" + (" delay 1ms" if kind == "netem" else ""),
        ],
        capture_output=True,
    )
    return probe.returncode == 0


def _inode(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


@dataclass
class Host:
    """One namespace host: its name, address, holder pid and the directory for its files."""

    name: str
    ip: str
    holder: subprocess.Popen
    directory: Path
    #: Processes that belong to the harness (sshd, cluster daemons): not orphans.
    daemons: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.holder.pid

    @property
    def net_inode(self) -> Optional[int]:
        return _inode(f"/proc/{self.pid}/ns/net")

    def command(self, argv: list[str], cwd: Optional[str] = None) -> list[str]:
        """``argv`` run inside this host's namespaces (network, hostname, mounts)."""
        wd = [f"--wd={cwd}"] if cwd else []
        return ["nsenter", "-t", str(self.pid), "-n", "-u", "-m", *wd, "--", *argv]

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 60)
        cwd = kwargs.pop("cwd", None)
        return subprocess.run(self.command(argv, cwd), **kwargs)

    def popen(self, argv: list[str], cwd: Optional[str] = None, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv, cwd), **kwargs)

    def processes(self) -> list[int]:
        """Every live process in this host's network namespace, the holder excluded."""
        inode = self.net_inode
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == self.pid:
                continue
            if inode is not None and _inode(f"/proc/{entry}/ns/net") == inode:
                try:
                    with open(f"/proc/{entry}/stat") as stat:
                        if stat.read().split(") ", 1)[1][0] == "Z":
                            continue
                except OSError:
                    continue
                found.append(int(entry))
        return found

    def orphans(self) -> list[str]:
        """Processes in this namespace other than the holder, the harness daemons and sshd's own
        session processes (``sshd: ...``), as ``pid cmdline`` strings."""
        keep = set(self.daemons)
        left = []
        for pid in self.processes():
            command = _cmdline(pid)
            if pid in keep or command.startswith("sshd:"):
                continue
            left.append(f"{pid} {command}")
        return left


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


_HOLDER = """
set -e
hostname "$KOLO_NS_HOSTNAME"
ip link set lo up
mount --bind "$KOLO_NS_DIR/hosts" /etc/hosts
mkdir -p /root/.ssh
mount --bind "$KOLO_NS_DIR/dotssh" /root/.ssh
mkdir -p "$KOLO_NS_DIR/ray" /tmp/ray
mount --bind "$KOLO_NS_DIR/ray" /tmp/ray
echo ready
exec sleep infinity
"""


class Cluster:
    """Hosts in namespaces joined by a bridge (see the module docs)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.hosts: dict[str, Host] = {}
        self.switch: Optional[subprocess.Popen] = None
        self.client_key = directory / "id_ed25519"

    @classmethod
    def create(cls, directory: Path, names: list[str]) -> Cluster:
        cluster = cls(directory)
        try:
            cluster._build(names)
        except BaseException:
            cluster.close()
            raise
        return cluster

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def _holder(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        holder = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **env},
            preexec_fn=_die_with_parent,
        )
        line = holder.stdout.readline()
        if line.strip() != "ready":
            holder.kill()
            raise RuntimeError(f"namespace holder failed: {line}{holder.stderr.read()}")
        return holder

    def _build(self, names: list[str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.client_key)],
            check=True,
        )
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.directory / "host_key")],
            check=True,
        )
        host_pub = (self.directory / "host_key.pub").read_text().split()[:2]
        addresses = {name: f"{SUBNET}.{i + 1}" for i, name in enumerate(names)}
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{ip} {name}\n" for name, ip in addresses.items()
        )
        known = "".join(f"{name},{ip} {' '.join(host_pub)}\n" for name, ip in addresses.items())
        self.switch = self._holder(
            [
                "unshare",
                "--net",
                "sh",
                "-c",
                "ip link set lo up && echo ready && exec sleep infinity",
            ],
            {},
        )
        sw = str(self.switch.pid)
        self._ip(sw, "link add br0 type bridge")
        self._ip(sw, "link set br0 up")
        for name, ip in addresses.items():
            directory = self.directory / name
            dotssh = directory / "dotssh"
            dotssh.mkdir(parents=True)
            (directory / "hosts").write_text(hosts_file)
            (dotssh / "known_hosts").write_text(known)
            shutil.copy(self.client_key, dotssh / "id_ed25519")
            holder = self._holder(
                [
                    "unshare",
                    "--net",
                    "--uts",
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    _HOLDER,
                ],
                {"KOLO_NS_HOSTNAME": name, "KOLO_NS_DIR": str(directory)},
            )
            host = Host(name, ip, holder, directory)
            self.hosts[name] = host
            port = self.port_of(name)
            self._ip(sw, f"link add {port} type veth peer name eth0 netns {holder.pid}")
            self._ip(sw, f"link set {port} master br0 up")
            self._ip(str(holder.pid), f"addr add {ip}/{PREFIX} dev eth0")
            self._ip(str(holder.pid), "link set eth0 up")
        for host in self.hosts.values():
            for other in self.hosts.values():
                if other is not host:
                    self._wait_reachable(host, other.ip)

    @staticmethod
    def _net(pid: str, tool: str, args: str) -> None:
        """Runs ``tool args`` (``ip`` or ``tc``) in the network namespace of ``pid``."""
        result = subprocess.run(
            ["nsenter", "-t", pid, "-n", tool, *args.split()], capture_output=True, text=True
        )
        if result.returncode != 0:
            raise RuntimeError(f"{tool} {args}: {result.stderr.strip()}")

    @classmethod
    def _ip(cls, pid: str, args: str) -> None:
        cls._net(pid, "ip", args)

    @staticmethod
    def _wait_reachable(host: Host, ip: str, timeout: float = 10) -> None:
        # A TCP connect to a closed port answers with a reset once the path is up.
        probe = (
            "import socket,sys,time\n"
            "end=time.time()+float(sys.argv[2])\n"
            "while True:\n"
            "  s=socket.socket(); s.settimeout(0.5)\n"
            "  try: s.connect((sys.argv[1],9)); sys.exit(0)\n"
            "  except ConnectionRefusedError: sys.exit(0)\n"
            "  except OSError:\n"
            "    if time.time()>end: sys.exit(1)\n"
            "    time.sleep(0.1)\n"
        )
        result = host.run([sys.executable, "-c", probe, ip, str(timeout)], timeout=timeout + 5)
        if result.returncode != 0:
            raise RuntimeError(f"{host.name} cannot reach {ip}")

    def port_of(self, name: str) -> str:
        """The name of ``name``'s link on the switch (the bridge port)."""
        return f"p-{name}"[:15]

    # -- sshd -------------------------------------------------------------------------------

    def start_sshd(self) -> None:
        """One sshd per host on ``<ip>:22`` accepting :attr:`client_key` for root."""
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        os.makedirs("/run/sshd", exist_ok=True)
        authorized = self.directory / "authorized_keys"
        shutil.copy(self.directory / "id_ed25519.pub", authorized)
        for host in self.hosts.values():
            config = host.directory / "sshd_config"
            config.write_text(
                f"Port 22\nListenAddress {host.ip}\nHostKey {self.directory / 'host_key'}\n"
                f"AuthorizedKeysFile {authorized}\nPidFile {host.directory / 'sshd.pid'}\n"
                "StrictModes no\nUsePAM no\nPubkeyAuthentication yes\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                "PermitRootLogin prohibit-password\nX11Forwarding no\nPrintMotd no\n"
                "LogLevel ERROR\nMaxStartups 100\n"
            )
            process = host.popen(
                [sshd, "-D", "-f", str(config), "-E", str(host.directory / "sshd.log")],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            host.daemons.append(process.pid)
        first = next(iter(self.hosts.values()))
        for host in self.hosts.values():
            deadline = time.monotonic() + 20
            while True:
                result = first.run(
                    [
                        "ssh",
                        "-o",
                        "BatchMode=yes",
                        "-o",
                        "ConnectTimeout=2",
                        "-i",
                        str(self.client_key),
                        host.name,
                        "hostname",
                    ],
                    timeout=10,
                )
                if result.returncode == 0 and result.stdout.strip() == host.name:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on {host.name} refused a key login: {result.stderr}")
                time.sleep(0.2)

    # -- faults -----------------------------------------------------------------------------

    def cut(self, name: str) -> None:
        """Takes ``name``'s link down on the switch: its packets go nowhere, nobody is told."""
        self._ip(str(self.switch.pid), f"link set {self.port_of(name)} down")

    def mend(self, name: str) -> None:
        """Brings ``name``'s link back up, and forgets the neighbours every host failed to
        reach meanwhile (else connecting fails with "no route to host" until they expire)."""
        self._ip(str(self.switch.pid), f"link set {self.port_of(name)} up")
        for host in self.hosts.values():
            self._ip(str(host.pid), "neigh flush all")

    def shape(self, name: str, qdisc: str) -> None:
        """Replaces the root queueing discipline of ``name``'s ``eth0`` (e.g. ``netem delay
        200ms loss 5%``) and of its switch port, so both directions are affected."""
        host = self.hosts[name]
        self._tc(str(host.pid), f"qdisc replace dev eth0 root {qdisc}")
        self._tc(str(self.switch.pid), f"qdisc replace dev {self.port_of(name)} root {qdisc}")

    def unshape(self, name: str) -> None:
        host = self.hosts[name]
        subprocess.run(
            ["nsenter", "-t", str(host.pid), "-n", "tc", "qdisc", "del", "dev", "eth0", "root"],
            capture_output=True,
        )
        subprocess.run(
            [
                "nsenter",
                "-t",
                str(self.switch.pid),
                "-n",
                "tc",
                "qdisc",
                "del",
                "dev",
                self.port_of(name),
                "root",
            ],
            capture_output=True,
        )

    @classmethod
    def _tc(cls, pid: str, args: str) -> None:
        cls._net(pid, "tc", args)

    # -- teardown ---------------------------------------------------------------------------

    def orphans(self, settle: float = 0) -> dict[str, list[str]]:
        """Per host, processes that outlived the job (see :meth:`Host.orphans`), waiting up to
        ``settle`` seconds for exiting ones to go."""
        deadline = time.monotonic() + settle
        while True:
            found = {name: h.orphans() for name, h in self.hosts.items()}
            found = {name: left for name, left in found.items() if left}
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.1)

    def kill_jobs(self) -> None:
        """Kills every non-daemon process in every host (between tests, after a failure)."""
        for host in self.hosts.values():
            for pid in host.processes():
                if pid not in host.daemons:
                    _kill(pid)

    def close(self) -> None:
        """Kills every process in the namespaces, then the holders (the namespaces go)."""
        for host in self.hosts.values():
            for pid in host.processes():
                _kill(pid)
        for holder in [*(h.holder for h in self.hosts.values()), self.switch]:
            if holder is not None and holder.poll() is None:
                holder.kill()
                holder.wait(timeout=10)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
