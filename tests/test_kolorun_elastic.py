"""kolorun's elastic launches on real processes (issue 21's must-show (a)-(e) under kolorun):
a rank SIGKILLed mid-epoch, hosts added and removed by a discovery script, a failing host
blacklisted and retried after its cooldown, the reset limit, and too few slots for longer than
the elastic timeout; plus ``kolo.run`` with elastic bounds.

Two names of this machine act as two hosts: ``localhost`` and its hostname both run ranks as
local child processes, and kolorun gives each rank ``KOLO_HOSTNAME=<host>``, so the job sees
two hosts (its blacklist, its rank order and its data plane treat them as such). The training
script is tests/workers/kolorun_elastic_worker.py (after Horovod's elastic_torch_main.py).
After every test no rank process and no /dev/shm/kolo* segment is left.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from support.processes import children
from support.shm_segments import leftovers, segments

from conftest import BIN, REPO, pid_alive, run_kolorun, worker, worker_env

ME = socket.gethostname()
WORKER = worker("kolorun_elastic_worker.py")


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if text.encode() in cmdline.read() and pid_alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _children() -> list[int]:
    return list(children(os.getpid()))


@pytest.fixture
def clean(tmp_path):
    """Checks that nothing the test started outlives it: rank processes (their command lines
    name tmp_path; kolo.run's ranks are this process's children) and shared memory."""
    segments_before = segments()
    # Other tests' long-lived helpers (Spark, Ray, sshd) may be this process's children too.
    before = set(_children())

    def new_children() -> set[int]:
        return set(_children()) - before

    yield tmp_path
    deadline = time.monotonic() + 10
    while (_processes_mentioning(str(tmp_path)) or new_children()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_mentioning(str(tmp_path)), "rank processes outlived the launch"
    assert not new_children(), "kolo.run left child processes"
    assert not leftovers(segments_before), "shared memory segments were left"


def discovery_script(tmp_path: Path, hosts: list[str]) -> tuple[Path, Path]:
    """A discovery script printing the hosts file the test rewrites, and that file."""
    listing = tmp_path / "hosts.txt"
    listing.write_text("\n".join(hosts) + "\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {listing}\n")
    script.chmod(0o755)
    return script, listing


def epoch_script(tmp_path: Path, logfile: Path, schedule: dict[int, list[str]]) -> Path:
    """A discovery script printing the hosts of the epoch rank 0 logged last (one log line per
    epoch; Horovod's elastic tests' template): ``schedule[epoch]``, the last entry after it."""
    last = max(schedule)
    cases = "".join(
        f"  {epoch}) printf '%s\\n' {' '.join(hosts)} ;;\n"
        for epoch, hosts in sorted(schedule.items())
        if epoch != last
    )
    script = tmp_path / "discover.sh"
    script.write_text(
        "#!/bin/sh\nepoch=0\n"
        f"[ -f {logfile} ] && epoch=$(wc -l < {logfile} | tr -d ' ')\n"
        f"case $epoch in\n{cases}  *) printf '%s\\n' {' '.join(schedule[last])} ;;\nesac\n"
    )
    script.chmod(0o755)
    return script


def epochs(logfile: Path) -> list[dict]:
    return [json.loads(line) for line in logfile.read_text().splitlines()]


def stamp(stdout: str, pattern: str) -> list[float]:
    """The timestamps the worker printed on lines matching ``pattern``."""
    return [float(m.group(1)) for m in re.finditer(rf"\]<stdout>:(\d+\.\d+) {pattern}", stdout)]


def test_a_killed_rank_leaves_and_the_survivors_finish_as_a_run_from_that_commit(clean) -> None:
    """(a) ``-np 3 --min-np 2``: the rank on one host SIGKILLs itself mid-epoch; the other two
    restore the last commit, reset into a round of 2 and finish. Their final weights equal
    those of a fixed 2-rank run started from the commit they restored."""
    tmp = clean
    script, _ = discovery_script(tmp, ["localhost:2", f"{ME}:1"])
    log = tmp / "log"
    result = run_kolorun(
        ["-np", "3", "--min-np", "2", "--host-discovery-script", str(script), "python", WORKER,
         "--logfile", str(log), "--kill-host", ME, "--kill-at", "[1, 2]",
         "--save-restored", str(tmp / "restored.pt"), "--weights", str(tmp / "elastic.pt")],
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert [(e["epoch"], e["size"]) for e in epochs(log)] == [(0, 3), (1, 2), (2, 2)]
    assert f"on host {ME} was killed by signal 9 (SIGKILL)" in result.stderr
    assert f"host {ME} is blacklisted" in result.stderr
    assert re.search(r"rendezvous 1: 3 rank\(s\)", result.stderr), result.stderr
    assert re.search(r"rendezvous 2: 2 rank\(s\) on localhost \[0, 1\]", result.stderr)
    killed = stamp(result.stdout, "killing myself")
    recovered = stamp(result.stdout, "first step of rendezvous 2")
    assert len(killed) == 1 and len(recovered) == 2, result.stdout[-3000:]
    print(f"kill -> first step of both survivors: {max(recovered) - killed[0]:.3f} s")

    import torch

    restored = torch.load(tmp / "restored.pt", weights_only=False)
    # The kill came before batch 2 of epoch 1; the last commit followed batch 1.
    assert (restored["epoch"], restored["batch"], restored["steps"]) == (1, 2, 7)
    reference = run_kolorun(
        ["-np", "2", "python", WORKER, "--logfile", str(tmp / "reference.log"),
         "--resume-from", str(tmp / "restored.pt"), "--weights", str(tmp / "reference.pt")],
        timeout=120,
    )  # fmt: skip
    assert reference.returncode == 0, reference.stderr[-5000:]
    elastic = torch.load(tmp / "elastic.pt")
    expected = torch.load(tmp / "reference.pt")
    for name, value in expected.items():
        assert torch.equal(elastic[name], value), (name, elastic[name] - value)
    # A lost or repeated step would show: the weights move at every step.
    assert not torch.equal(elastic["weight"], restored["model"]["weight"])


def test_hosts_added_and_removed_across_epochs_set_the_size(clean) -> None:
    """(b) The script adds a host after epoch 0 and removes the first one after epoch 1: the
    size follows (1, 2, 1), the new host's rank carries on as rank 0, every rendezvous is in
    kolorun's log, and a rank's HOROVOD_RANK/SIZE follow its round."""
    tmp = clean
    log = tmp / "log"
    schedule = {0: ["localhost:1"], 1: ["localhost:1", f"{ME}:1"], 2: [f"{ME}:1"]}
    script = epoch_script(tmp, log, schedule)
    result = run_kolorun(
        ["-np", "1", "--min-np", "1", "--max-np", "2", "--host-discovery-script", str(script),
         "python", WORKER, "--logfile", str(log), "--hosts-schedule", json.dumps(schedule)],
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    seen = [(e["epoch"], e["size"], e["host"], e["start_rank"]) for e in epochs(log)]
    assert seen == [(0, 1, "localhost", 0), (1, 2, "localhost", 0), (2, 1, ME, 1)], seen
    last = epochs(log)[-1]
    assert (last["rank"], last["env_rank"], last["env_size"], last["rendezvous"]) == (
        0,
        "0",
        "1",
        3,
    )
    for n, size in ((1, 1), (2, 2), (3, 1)):
        assert f"rendezvous {n}: {size} rank(s)" in result.stderr, result.stderr
    assert f'added ["{ME}:1"]' in result.stderr
    assert "stopping rank 0 (task 0) on host localhost: host localhost is no longer discovered" in (
        result.stderr
    )


def test_a_failing_host_is_blacklisted_and_retried_after_its_cooldown(clean) -> None:
    """(c) The rank started on one host fails at once, twice; with
    ``--blacklist-cooldown-range 1 2`` the host comes back after each cooldown (2 s: the
    formula gives 2-3 s, capped at MAX) with a new task index, and the third rank stays: the
    job ends at size 2."""
    tmp = clean
    script, _ = discovery_script(tmp, ["localhost:1", f"{ME}:1"])
    log = tmp / "log"
    counter = tmp / "failures"
    result = run_kolorun(
        ["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "1", "2",
         "--host-discovery-script", str(script), "python", WORKER, "--logfile", str(log),
         "--fail-host", ME, "--fail-times", "2", "--fail-counter", str(counter),
         "--epochs", "2", "--until-size", "2", "--epoch-wait", "0.2", "--max-epochs", "300"],
        timeout=150,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert counter.read_text().split() == ["x", "x"]
    blacklisted = re.findall(rf"host {ME} is blacklisted for (\d+\.\d) s", result.stderr)
    assert len(blacklisted) == 2 and all(1.0 <= float(s) <= 2.0 for s in blacklisted), blacklisted
    assert result.stderr.count(f'host(s) ["{ME}"] may run ranks again') == 2, result.stderr
    # Tasks 1 and 2 failed on the host; task 3 joined and stayed.
    assert f"task 3 on {ME}" in result.stderr
    assert epochs(log)[-1]["size"] == 2


def test_passing_the_reset_limit_fails_the_job_with_a_clear_error(clean) -> None:
    """(d) The schedule of (b) needs two resets; ``--reset-limit 1`` stops the job at the
    second: a clear error, a non-zero exit, and the rank raises ResetLimitExceededError."""
    tmp = clean
    log = tmp / "log"
    schedule = {0: ["localhost:1"], 1: ["localhost:1", f"{ME}:1"], 2: [f"{ME}:1"]}
    script = epoch_script(tmp, log, schedule)
    result = run_kolorun(
        ["-np", "1", "--min-np", "1", "--max-np", "2", "--reset-limit", "1",
         "--host-discovery-script", str(script), "python", WORKER, "--logfile", str(log),
         "--hosts-schedule", json.dumps(schedule)],
        timeout=120,
    )  # fmt: skip
    assert result.returncode != 0, result.stderr[-5000:]
    assert "the elastic job failed" in result.stderr
    assert "exceeded its limit of 1 (--reset-limit 1)" in result.stderr, result.stderr[-5000:]
    assert "ResetLimitExceededError" in result.stderr, result.stderr[-5000:]
    assert [e["size"] for e in epochs(log)] == [1, 2]


def test_too_few_slots_for_longer_than_the_elastic_timeout_fails_naming_both(clean) -> None:
    """(e) ``--min-np 2 --elastic-timeout 3``: the test removes one of the two hosts while the
    job trains; one slot is left, and after 3 s the job fails naming 1 and 2."""
    tmp = clean
    script, listing = discovery_script(tmp, ["localhost:1", f"{ME}:1"])
    log = tmp / "log"
    started = time.monotonic()
    launch = subprocess.Popen(
        [str(BIN / "kolorun"), "-np", "2", "--min-np", "2", "--elastic-timeout", "3",
         "--host-discovery-script", str(script), "python", WORKER, "--logfile", str(log),
         "--epochs", "1000", "--epoch-wait", "0.2"],
        cwd=REPO, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while not (log.exists() and log.read_text()):
            assert launch.poll() is None, launch.communicate()
            assert time.monotonic() - started < 90, "no epoch within 90 s"
            time.sleep(0.1)
        listing.write_text("localhost:1\n")
        removed = time.monotonic()
        _, stderr = launch.communicate(timeout=60)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.communicate()
    assert launch.returncode != 0, stderr[-5000:]
    assert re.search(
        r"only 1 slot\(s\) were available, fewer than --min-np 2, for 3 s \(--elastic-timeout\)"
        r"|only 1 of the minimum 2 processes \(--min-np\) were available for 3 s",
        stderr,
    ), stderr[-5000:]
    # Waited the timeout, not much longer (discovery polls every second; ranks stop in 3 s).
    assert 3 <= time.monotonic() - removed < 30


def test_kolo_run_with_elastic_bounds_returns_the_survivors_results(clean) -> None:
    """``kolo.run(min_num_proc=...)`` runs elastically: the rank on one host dies at step 5,
    the other restores its last commit and finishes alone; ``run`` returns its result."""
    import kolo

    def _elastic_fn(kill_host: str) -> dict:
        import os
        import signal

        import torch

        import kolo.torch as hvd

        hvd.init()
        state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0, total=0.0)

        @hvd.elastic.run
        def train(state):
            while state.step < 12:
                if state.step == 5 and os.environ["HOROVOD_HOSTNAME"] == kill_host:
                    os.kill(os.getpid(), signal.SIGKILL)
                state.total += hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
                state.step += 1
                state.commit()

        train(state)
        return dict(
            rank=hvd.rank(), size=hvd.size(), total=state.total, host=os.environ["HOROVOD_HOSTNAME"]
        )

    results = kolo.run(
        _elastic_fn,
        args=(ME,),
        num_proc=2,
        min_num_proc=1,
        hosts=f"localhost:1,{ME}:1",
        elastic_timeout=30,
    )
    # Steps 0-4 at size 2 (total 10), steps 5-11 at size 1 (7).
    assert results == [dict(rank=0, size=1, total=17.0, host="localhost")]


def test_a_rank_that_raises_after_a_reset_leaves_alone(clean) -> None:
    """A rank's failure report names its task, not the rank of its first round: after a reset
    renumbered the ranks, the rank that raises leaves and the one that now holds its old rank
    number carries on. Three host names of this machine: localhost, LOCALHOST and its hostname
    (each a host of its own to the job)."""
    import kolo

    def fn(kill_host: str, raise_host: str) -> dict:
        import os
        import signal

        import torch

        import kolo.torch as hvd

        hvd.init()
        state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)

        @hvd.elastic.run
        def train(state):
            host = os.environ["HOROVOD_HOSTNAME"]
            while state.step < 10:
                if state.step == 2 and host == kill_host:
                    os.kill(os.getpid(), signal.SIGKILL)
                if state.step == 5 and host == raise_host:
                    raise ValueError(f"{host} gives up")
                hvd.allreduce(torch.ones(1))
                state.step += 1
                state.commit()

        train(state)
        return dict(host=os.environ["HOROVOD_HOSTNAME"], rank=hvd.rank(), size=hvd.size())

    # Round 1: localhost 0, ME 1, LOCALHOST 2. localhost dies: round 2 has ME as rank 0 and
    # LOCALHOST as rank 1. ME raises: a report by its first rank (1) would remove LOCALHOST.
    results = kolo.run(
        fn,
        args=("localhost", ME),
        num_proc=3,
        min_num_proc=1,
        hosts=f"localhost:1,{ME}:1,LOCALHOST:1",
        elastic_timeout=30,
    )
    assert results == [dict(host="LOCALHOST", rank=0, size=1)]
