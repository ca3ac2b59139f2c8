"""kolorun over ssh: a real sshd on 127.0.0.1 with a generated key; KOLO_HOSTNAME (set by
kolorun from the -H entries) makes `localhost` and `127.0.0.1` two hosts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_kolorun
from test_example import parse_run

pytestmark = pytest.mark.ssh


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory) -> tuple[int, Path]:
    directory = tmp_path_factory.mktemp("sshd")
    port = free_port()
    subprocess.run(
        ["sh", str(REPO / "tests" / "support" / "start_sshd.sh"), str(directory), str(port)],
        check=True,
        timeout=60,
    )
    yield port, directory / "id_ed25519"
    pid = int((directory / "sshd.pid").read_text())
    os.kill(pid, signal.SIGTERM)


def ssh_args(sshd: tuple[int, Path]) -> list[str]:
    port, key = sshd
    return ["-p", str(port), "--ssh-identity-file", str(key)]


def test_torch_digits_over_ssh_on_two_simulated_hosts(sshd) -> None:
    result = run_kolorun(
        ["-H", "localhost:1,127.0.0.1:1", *ssh_args(sshd), "python", "examples/torch_digits.py"],
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    accuracy, checksums, placements = parse_run(result.stdout)
    assert accuracy >= 0.90
    assert len(checksums) == 1, checksums
    # Two hosts with one rank each: both local_rank 0, cross ranks 0 and 1.
    assert any(p.startswith("rank 0 of 2: local_rank 0, cross_rank 0/2") for p in placements)
    assert any(p.startswith("rank 1 of 2: local_rank 0, cross_rank 1/2") for p in placements)


def test_remote_rank_failure_fails_fast_over_ssh(sshd) -> None:
    code = (
        "import os, time, torch, kolo.torch as hvd; hvd.init(); "
        "hvd.barrier(); "
        "os._exit(5) if hvd.rank() == 1 else [hvd.allreduce(torch.ones(8)) for _ in iter(int, 1)]"
    )
    result = run_kolorun(
        ["-H", "localhost:1,127.0.0.1:1", *ssh_args(sshd), "python", "-c", code], timeout=120
    )
    assert result.returncode != 0
    assert "rank 1 on host 127.0.0.1" in result.stderr, result.stderr[-3000:]
    assert "JobAbortedError" in result.stderr or "PeerConnectionError" in result.stderr
