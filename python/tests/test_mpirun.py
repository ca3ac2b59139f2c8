"""``kolorun --mpi``'s mpirun command, checked against horovodrun's (``mpi_run.py``, 0.28.1)."""

from __future__ import annotations

import pytest

from kolo._mpirun import MPICH, OPEN_MPI, UNKNOWN, hosts_arg, mpirun_argv
from kolo.exceptions import ConfigError
from kolo.runner import parse_args


def test_open_mpi_command_is_horovods() -> None:
    parsed = parse_args(["--mpi", "-np", "2", "python", "train.py", "--lr", "0.1"])
    argv = mpirun_argv(
        parsed, OPEN_MPI, ["PATH", "OLDPWD", "KOLO_JOB_SECRET", "A_CUDA_VISIBLE_DEVICES"]
    )
    assert argv == [
        "mpirun", "--allow-run-as-root", "--tag-output", "-np", "2", "-H", "localhost:2",
        "-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib",
        "-x", "KOLO_JOB_SECRET", "-x", "PATH",
        "python", "train.py", "--lr", "0.1",
    ]  # fmt: skip


def test_options_reach_mpirun_where_horovod_puts_them(tmp_path) -> None:
    parsed = parse_args(
        [
            "--mpi", "-H", "a:2,b:2", "--binding-args=-bind-to core", "-prefix-timestamp",
            "--network-interfaces", "eth0,eth1", "-p", "2222", "--output-filename", "/o",
            "--mpi-args=--mca btl_tcp_if_exclude lo -x FOO", "python", "t.py",
        ]
    )  # fmt: skip
    argv = mpirun_argv(parsed, OPEN_MPI, [])
    assert argv[:6] == ["mpirun", "--allow-run-as-root", "--tag-output", "-np", "4", "-H"]
    assert argv[6] == "a:2,b:2"
    assert argv[7:9] == ["-bind-to", "core"] and "none" not in argv
    assert "--timestamp-output" in argv
    assert argv[argv.index("plm_rsh_args") + 1] == "-p 2222"
    assert argv[argv.index("btl_tcp_if_include") + 1] == "eth0,eth1"
    assert "NCCL_SOCKET_IFNAME=eth0,eth1" in argv
    assert argv[argv.index("--output-filename") + 1] == "/o"
    assert argv[-7:] == ["--mca", "btl_tcp_if_exclude", "lo", "-x", "FOO", "python", "t.py"]


def test_mpich_gets_hydra_spellings_and_no_dash_x(tmp_path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnode1 slots=2\nnode2 slots=2\n")
    parsed = parse_args(["--mpi", "--hostfile", str(hostfile), "python", "t.py"])
    assert hosts_arg(parsed) == "node1:2,node2:2"
    argv = mpirun_argv(parsed, MPICH, ["PATH"])
    assert argv == [
        "mpirun", "-l", "-np", "4", "-hosts", "node1,node2", "-ppn", "2",
        "-bind-to", "none", "-map-by", "slot", "python", "t.py",
    ]  # fmt: skip
    uneven = parse_args(["--mpi", "-H", "a:1,b:2", "python", "t.py"])
    with pytest.raises(ConfigError, match="-ppn"):
        mpirun_argv(uneven, MPICH, [])


def test_mpirun_arguments_select_mpi_and_gloo_excludes_it() -> None:
    assert parse_args(["-np", "2", "--mpi-args=-v", "x"])["controller"] == "mpi"
    assert parse_args(["-np", "2", "--gloo", "x"])["notices"] == []
    with pytest.raises(ConfigError, match="at most one"):
        parse_args(["-np", "2", "--gloo", "--mpi", "x"])
    with pytest.raises(ConfigError, match="no MPI kolorun knows"):
        mpirun_argv(parse_args(["--mpi", "-np", "2", "x"]), UNKNOWN, [])


def test_the_rendezvous_port_is_free_and_outside_the_ephemeral_range() -> None:
    """Rank 0 binds the port only after mpirun started it; a port from the ephemeral range may
    by then be the local port of one of mpirun's own connections (seen with MPICH's hydra)."""
    import socket

    from kolo._mpirun import rendezvous_addr

    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        ephemeral_low = int(ports.read().split()[0])
    for _ in range(20):
        host, port = rendezvous_addr(parse_args(["--mpi", "-np", "2", "python", "t.py"])).split(":")
        assert host == "127.0.0.1"
        assert 1024 <= int(port) < ephemeral_low, port
        with socket.socket() as server:
            server.bind((host, int(port)))
