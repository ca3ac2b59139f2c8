"""kolorun over ssh: a real sshd on 127.0.0.1 with a generated key; KOLO_HOSTNAME (set by
kolorun from the -H entries) makes `localhost` and `127.0.0.1` two hosts."""

from __future__ import annotations

import json
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


#: Runs on every rank: what it sees, and whether a marker value shows in any process's argv
#: on this machine (kolorun's ssh client, the remote shell, the rank: `ps` would show it).
SEE_ENV_CODE = """
import glob, json, os
import kolo.torch as hvd
names = ["MY_TOKEN", "HOROVOD_CYCLE_TIME", "KOLO_CYCLE_TIME", "HOROVOD_RANK",
         "HOROVOD_HOSTNAME", "SHLVL", "OLDPWD", "HOROVOD_STALL_CHECK_DISABLE"]
seen = {name: os.environ.get(name) for name in names}
hvd.init()
markers = [os.environ["MY_TOKEN"], os.environ["KOLO_JOB_SECRET"]]
shown = []
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        argv = open(path, "rb").read().decode(errors="replace")
    except OSError:
        continue
    shown += [m[:6] for m in markers if m in argv]
print(json.dumps(dict(rank=hvd.rank(), env=seen, shown=shown)))
"""


def test_config_file_and_forwarded_environment_reach_ssh_ranks_off_the_command_line(
    sshd, tmp_path
) -> None:
    config = tmp_path / "horovod.yaml"
    config.write_text("params:\n  cycle_time_ms: 4\nstall_check:\n  enabled: false\n")
    token = "tok-" + os.urandom(8).hex()
    result = run_kolorun(
        [
            *("-H", "localhost:1,127.0.0.1:1", *ssh_args(sshd), "--verbose"),
            *("--config-file", str(config), "python", "-c", SEE_ENV_CODE),
        ],
        env={"MY_TOKEN": token, "SHLVL": "9", "OLDPWD": "/nowhere"},
        timeout=180,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = {}
    for line in result.stdout.splitlines():
        _, _, payload = line.partition("<stdout>:")
        if payload.startswith("{"):
            info = json.loads(payload)
            ranks[info["rank"]] = info
    assert sorted(ranks) == [0, 1], result.stdout
    for rank, info in ranks.items():
        assert info["env"] == {
            "MY_TOKEN": token,
            "HOROVOD_CYCLE_TIME": "4",
            "KOLO_CYCLE_TIME": "4",
            "HOROVOD_RANK": str(rank),
            "HOROVOD_HOSTNAME": ["localhost", "127.0.0.1"][rank],
            # Deny-listed: local ranks lose them; the remote shell sets its own.
            "SHLVL": info["env"]["SHLVL"] if rank == 1 else None,
            "OLDPWD": info["env"]["OLDPWD"] if rank == 1 else None,
            "HOROVOD_STALL_CHECK_DISABLE": "1",
        }, info
        assert info["shown"] == [], info
    assert ranks[1]["env"]["SHLVL"] != "9" and ranks[1]["env"]["OLDPWD"] != "/nowhere"
    # The verbose launch log shows the ssh command: without the forwarded values.
    ssh_lines = [line for line in result.stderr.splitlines() if "task 1 on 127.0.0.1: ssh" in line]
    assert len(ssh_lines) == 1, result.stderr[-3000:]
    assert token not in ssh_lines[0] and "cycle" not in ssh_lines[0].lower()
