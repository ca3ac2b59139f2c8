"""``kolorun --mpi``: hands the launch to ``mpirun`` as horovodrun's ``mpi_run`` does
(``horovod/runner/mpi_run.py``), and the ranks meet through kolo's mpirun path
(:mod:`kolo._mpi_launch`).

kolorun builds Horovod's ``mpirun`` command (Open MPI: ``--allow-run-as-root --tag-output -np N
-H HOSTS -bind-to none -map-by slot -mca pml ob1 -mca btl ^openib -x NAME...``; MPICH: ``-l``,
``-hosts``, ``-ppn``), puts a fresh job secret and a rendezvous address in the environment
(``KOLO_JOB_SECRET``, ``KOLO_RENDEZVOUS_ADDR``: forwarded by name with ``-x``, never on the
command line) and replaces itself with ``mpirun``, as horovodrun does: exit status, Ctrl-C and
the ``[1,0]<stdout>:`` line prefixes are mpirun's.
"""

from __future__ import annotations

import os
import random
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
from typing import Any, NoReturn, Optional

from kolo._nics import interface_ip
from kolo.exceptions import ConfigError

OPEN_MPI, SPECTRUM_MPI, MPICH, INTEL_MPI = "OpenMPI", "SpectrumMPI", "MPICH", "IntelMPI"
UNKNOWN, MISSING = "Unknown", "Missing"

#: Horovod's ``env.IGNORE_REGEXES``: variables ``mpirun -x`` does not forward.
_NOT_EXPORTED = re.compile(r"BASH_FUNC_.*|OLDPWD|.*CUDA_VISIBLE_DEVICES|HOROVOD_SECRET_KEY")
_NO_BINDING_ARGS = ["-bind-to", "none", "-map-by", "slot"]
_SOCKET_BINDING_ARGS = ["-bind-to", "socket", "-map-by", "socket", "-rank-by", "core"]
_LOCAL_HOSTS = ("localhost", "127.0.0.1", socket.gethostname())
_INSTALL_HINT = (
    "install Open MPI or MPICH (e.g. apt-get install openmpi-bin, or MPICH's mpich package) so "
    "that mpirun is on PATH, or drop --mpi/--mpi-args/--binding-args to let kolorun start the "
    "ranks itself"
)


def mpi_implementation(env: Optional[dict[str, str]] = None) -> str:
    """Which MPI ``mpirun --version`` names, as Horovod's ``_get_mpi_implementation`` (and
    MPICH's Hydra banner, which Horovod misses):
    ``"OpenMPI"``, ``"SpectrumMPI"``, ``"MPICH"``, ``"IntelMPI"``, ``"Unknown"`` or
    ``"Missing"`` (no mpirun, or it failed).

    Example::

        mpi_implementation()  # 'OpenMPI' with Debian's openmpi-bin
    """
    try:
        done = subprocess.run(
            ["mpirun", "--version"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return MISSING
    if done.returncode != 0:
        return MISSING
    output = done.stdout + done.stderr
    if "Open MPI" in output or "OpenRTE" in output:
        return OPEN_MPI
    if "IBM Spectrum MPI" in output:
        return SPECTRUM_MPI
    if "Intel(R) MPI" in output:
        return INTEL_MPI
    # Horovod looks for "MPICH" only; Debian's MPICH 4 prints "HYDRA build details" (Hydra is
    # MPICH's process manager; Intel MPI's, which says so, is matched above).
    if "MPICH" in output or "HYDRA" in output:
        return MPICH
    return UNKNOWN


def hosts_arg(parsed: dict[str, Any]) -> str:
    """``host:slots,...`` from ``-H`` or ``--hostfile`` (``host slots=N`` or ``host:N`` lines),
    else ``localhost:<np>``, as horovodrun's ``_run`` gives mpi_run."""
    if parsed["hosts"]:
        return ",".join(part.strip() for part in parsed["hosts"].split(",") if part.strip())
    if parsed["hostfile"]:
        entries = []
        try:
            with open(parsed["hostfile"]) as handle:
                lines = handle.read().splitlines()
        except OSError as err:
            raise ConfigError(
                f"kolorun: cannot read --hostfile {parsed['hostfile']}: {err}"
            ) from None
        for line in lines:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, rest = line.partition(" ")
            slots = rest.split("=", 1)[1].strip() if "slots=" in rest else None
            entries.append(f"{name}:{slots}" if slots else name)
        return ",".join(entries)
    return f"localhost:{parsed['num_proc']}"


def _check_host(name: str, entry: str) -> None:
    """A :class:`ConfigError` for a host mpirun's ssh would misread, as kolorun's own launcher
    refuses them: empty, starting with ``-`` (``-oProxyCommand=...`` is an ssh option), or
    holding whitespace or control characters."""
    user, _, host = name.rpartition("@")
    if (
        not host
        or ("@" in name and not user)
        or name.startswith("-")
        or host.startswith("-")
        or any(c.isspace() or not c.isprintable() for c in name)
    ):
        raise ConfigError(
            f"kolorun: host entry {entry!r} is refused: it is empty, starts with `-` (ssh would "
            "read it as an option) or holds whitespace or a control character; give a host "
            "name, an IP address or user@host"
        )


def _slots(hosts: str) -> list[tuple[str, int]]:
    pairs = []
    for entry in hosts.split(","):
        name, _, count = entry.partition(":")
        _check_host(name, entry)
        try:
            pairs.append((name, int(count) if count else 1))
        except ValueError:
            raise ConfigError(f"kolorun: host entry {entry!r} is not host or host:slots") from None
    return pairs


def mpirun_argv(parsed: dict[str, Any], implementation: str, env_names: list[str]) -> list[str]:
    """Horovod's mpirun command for a parsed kolorun command line (``parse_args``), the MPI
    ``implementation`` and the variables to forward (``-x``; MPICH forwards the environment
    itself).

    Example::

        mpirun_argv(parse_args(["--mpi", "-np", "2", "python", "t.py"]), "OpenMPI", ["A"])
        # ['mpirun', '--allow-run-as-root', '--tag-output', '-np', '2', '-H', 'localhost:2',
        #  '-bind-to', 'none', '-map-by', 'slot', '-mca', 'pml', 'ob1', '-mca', 'btl',
        #  '^openib', '-x', 'A', 'python', 't.py']
    """
    if implementation == OPEN_MPI:
        impl_flags, binding = ["-mca", "pml", "ob1", "-mca", "btl", "^openib"], _NO_BINDING_ARGS
    elif implementation == SPECTRUM_MPI:
        impl_flags, binding = [], _SOCKET_BINDING_ARGS
    elif implementation == MPICH:
        impl_flags, binding = [], _NO_BINDING_ARGS
    elif implementation == INTEL_MPI:
        impl_flags, binding = [], []
    else:
        raise ConfigError(
            f"kolorun --mpi: mpirun --version names no MPI kolorun knows ({implementation}); "
            "Open MPI, MPICH, Intel MPI and IBM Spectrum MPI are supported"
        )
    mpich = implementation in (MPICH, INTEL_MPI)
    hosts = hosts_arg(parsed)
    slots = _slots(hosts)
    num_proc = parsed["num_proc"] or sum(count for _, count in slots)
    argv = ["mpirun", *(["-l"] if mpich else ["--allow-run-as-root", "--tag-output"])]
    argv += ["-np", str(num_proc)]
    if mpich:
        argv += ["-hosts", ",".join(name for name, _ in slots)]
        if len({count for _, count in slots}) > 1:
            raise ConfigError(
                "kolorun --mpi: MPICH's -ppn needs the same number of slots on every host; "
                "give a machinefile through --mpi-args instead"
            )
        argv += ["-ppn", str(slots[0][1])]
    else:
        argv += ["-H", hosts]
        if len(slots) >= 64:  # Horovod's _LARGE_CLUSTER_THRESHOLD
            impl_flags += ["-mca", "plm_rsh_no_tree_spawn", "true"]
            impl_flags += ["-mca", "plm_rsh_num_concurrent", str(len(slots))]
        if parsed["prefix_output_with_timestamp"]:
            impl_flags.append("--timestamp-output")
    binding_args = parsed["binding_args"]
    argv += shlex.split(binding_args) if binding_args and not mpich else binding
    argv += impl_flags
    ssh = []
    if parsed["ssh_port"]:
        ssh.append(f"-p {parsed['ssh_port']}")
    if parsed["ssh_identity_file"]:
        ssh.append(f"-i {parsed['ssh_identity_file']}")
    if ssh:
        if mpich:
            argv += ["-bootstrap=ssh", "-bootstrap-exec-args", " ".join(ssh)]
        else:
            argv += ["-mca", "plm_rsh_args", " ".join(ssh)]
    nics = parsed["network_interfaces"]
    if nics and not mpich:
        argv += ["-mca", "btl_tcp_if_include", ",".join(nics)]
    if nics:
        argv += ["-genv" if mpich else "-x", "NCCL_SOCKET_IFNAME=" + ",".join(nics)]
    if parsed["output_filename"]:
        argv += ["-outfile-pattern" if mpich else "--output-filename", parsed["output_filename"]]
    if not mpich:
        for name in sorted(env_names):
            if not _NOT_EXPORTED.fullmatch(name):
                argv += ["-x", name]
    if parsed["mpi_args"]:
        argv += shlex.split(parsed["mpi_args"])
    return argv + list(parsed["command"])


def rendezvous_addr(parsed: dict[str, Any]) -> str:
    """``host:port`` where launcher rank 0 starts the job driver when the ranks have no
    mpi4py: loopback when every host is this machine, else this machine's address on the first
    ``--network-interfaces`` entry, or toward the first remote host. The port is free now."""
    remote = [name for name, _ in _slots(hosts_arg(parsed)) if name not in _LOCAL_HOSTS]
    host = "127.0.0.1"
    if remote:
        nics = parsed["network_interfaces"]
        host = (interface_ip(nics[0]) if nics else None) or _ip_toward(remote[0])
    return f"{host}:{_free_port(host if not remote else '')}"


def _free_port(bind_host: str) -> int:
    """A port free on ``bind_host`` now and outside the kernel's ephemeral range: the driver
    binds it only once mpirun started rank 0, and a port from that range (what binding port 0
    gives) may meanwhile become the local port of one of mpirun's own connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            ephemeral_low = int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    low = 10000 if ephemeral_low > 11024 else 1024
    candidates = random.sample(range(low, max(low + 1, ephemeral_low)), k=64)
    for port in candidates:
        with socket.socket() as probe:
            try:
                probe.bind((bind_host, port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:
        probe.bind((bind_host, 0))
        return int(probe.getsockname()[1])


def _ip_toward(host: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return probe.getsockname()[0]


def exec_mpirun(parsed: dict[str, Any]) -> NoReturn:
    """Replaces this process with Horovod's mpirun command for ``parsed`` (a kolorun command
    line with ``--mpi``); raises :class:`~kolo.exceptions.ConfigError` when no usable mpirun is
    on PATH or the command line cannot be run through it."""
    if parsed["host_discovery_script"]:
        raise ConfigError(
            "kolorun: --host-discovery-script (elastic) cannot run through mpirun, as in "
            "horovodrun; drop --mpi or give the hosts with -H/--hostfile"
        )
    if shutil.which("mpirun") is None:
        raise ConfigError(f"kolorun --mpi: no mpirun on PATH: {_INSTALL_HINT}")
    env = dict(os.environ)
    implementation = mpi_implementation(env)
    if implementation == MISSING:
        raise ConfigError(f"kolorun --mpi: `mpirun --version` failed: {_INSTALL_HINT}")
    env.update(parsed["env"])
    env["KOLO_JOB_SECRET"] = secrets.token_hex(32)
    env["KOLO_RENDEZVOUS_ADDR"] = rendezvous_addr(parsed)
    if parsed["start_timeout"] is not None:
        env["KOLO_START_TIMEOUT"] = str(parsed["start_timeout"])
    for name in ("KOLO_DRIVER_ADDR", "KOLO_JOB_ID", "KOLO_TASK_INDEX", "KOLO_NUM_TASKS"):
        env.pop(name, None)
    argv = mpirun_argv(parsed, implementation, list(env))
    for flag, text in parsed["notices"]:
        print(f"kolorun: note: {flag}: {text}", file=sys.stderr)
    if parsed["verbose"]:
        print(f"kolorun: {implementation}: {shlex.join(argv)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe("mpirun", argv, env)
