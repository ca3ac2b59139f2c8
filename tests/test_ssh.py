"""kolorun over ssh: a real sshd on 127.0.0.1 with a generated key, its host key pinned in a
known_hosts file (kolorun checks host keys); KOLO_HOSTNAME (set by kolorun from the -H entries)
makes `localhost` and `127.0.0.1` two hosts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, output_tail, run_kolorun
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


def ssh_env(sshd: tuple[int, Path], extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that makes kolorun check the test sshd's key against the pinned one."""
    return {"KOLO_SSH_KNOWN_HOSTS": str(sshd[1].parent / "known_hosts"), **(extra or {})}


def test_torch_digits_over_ssh_on_two_simulated_hosts(sshd) -> None:
    result = run_kolorun(
        ["-H", "localhost:1,127.0.0.1:1", *ssh_args(sshd), "python", "examples/torch_digits.py"],
        env=ssh_env(sshd),
        timeout=300,
    )
    assert result.returncode == 0, output_tail(result)
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
        ["-H", "localhost:1,127.0.0.1:1", *ssh_args(sshd), "python", "-c", code],
        env=ssh_env(sshd),
        timeout=120,
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
markers = [os.environ["MY_TOKEN"], os.environ["KOLO_JOB_SECRET"], os.environ["KOLO_JOB_ID"]]
shown = []
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        argv = open(path, "rb").read().decode(errors="replace")
    except OSError:
        continue
    shown += [m[:6] for m in markers if m in argv]
print(json.dumps(dict(rank=hvd.rank(), env=seen, shown=shown, job_id=os.environ["KOLO_JOB_ID"])))
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
        env=ssh_env(sshd, {"MY_TOKEN": token, "SHLVL": "9", "OLDPWD": "/nowhere"}),
        timeout=180,
    )
    assert result.returncode == 0, output_tail(result)
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
    # Neither the secret nor the job id shows in any argv (checked by the ranks above) nor in
    # kolorun's verbose launch log.
    job_id = ranks[0]["job_id"]
    assert len(job_id) == 32 and ranks[1]["job_id"] == job_id
    assert job_id not in result.stderr, result.stderr[-3000:]
    # The verbose launch log shows the ssh command: without the forwarded values.
    ssh_lines = [line for line in result.stderr.splitlines() if "task 1 on 127.0.0.1: ssh" in line]
    assert len(ssh_lines) == 1, result.stderr[-3000:]
    assert token not in ssh_lines[0] and "cycle" not in ssh_lines[0].lower()


def known_hosts_line(sshd: tuple[int, Path], key_file: Path) -> str:
    port, _ = sshd
    algorithm, key = key_file.read_text().split()[:2]
    return f"[127.0.0.1]:{port} {algorithm} {key}\n"


def test_a_host_whose_key_differs_from_the_pinned_one_is_refused_before_anything_runs(
    sshd, tmp_path
) -> None:
    # known_hosts pins another key for the host: an impostor as far as ssh can tell.
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")],
        check=True,
        timeout=30,
    )
    pinned = tmp_path / "known_hosts"
    pinned.write_text(known_hosts_line(sshd, tmp_path / "other.pub"))
    marker = tmp_path / "rank-ran"
    result = run_kolorun(
        ["-H", "127.0.0.1:1", *ssh_args(sshd), "touch", str(marker)],
        env={"KOLO_SSH_KNOWN_HOSTS": str(pinned)},
        timeout=60,
    )
    assert result.returncode != 0
    assert "Host key verification failed" in result.stderr, result.stderr[-3000:]
    assert not marker.exists()
    # Only the explicit opt-out (horovodrun's behaviour) connects anyway.
    result = run_kolorun(
        ["-H", "127.0.0.1:1", *ssh_args(sshd), "touch", str(marker)],
        env={"KOLO_SSH_KNOWN_HOSTS": str(pinned), "KOLO_SSH_STRICT_HOST_KEY_CHECKING": "no"},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert marker.exists()


def test_a_new_host_is_accepted_and_its_key_recorded(sshd, tmp_path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    result = run_kolorun(
        ["-H", "127.0.0.1:1", *ssh_args(sshd), "true"],
        env={"KOLO_SSH_KNOWN_HOSTS": str(known_hosts)},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    host_key = (sshd[1].parent / "host_ed25519.pub").read_text().split()[1]
    assert host_key in known_hosts.read_text()
    # With `yes`, only recorded hosts: a fresh file refuses the host.
    known_hosts.write_text("")
    result = run_kolorun(
        ["-H", "127.0.0.1:1", *ssh_args(sshd), "true"],
        env={"KOLO_SSH_KNOWN_HOSTS": str(known_hosts), "KOLO_SSH_STRICT_HOST_KEY_CHECKING": "yes"},
        timeout=60,
    )
    assert result.returncode != 0
    assert "Host key verification failed" in result.stderr, result.stderr[-3000:]
