"""How fast an elastic job recovers: a rank SIGKILLed, and a rank added, at 2, 4 and 8 ranks;
and what a commit of a 100 MB ``TorchState`` costs against a memcpy of it.

    python bench/elastic.py [--ranks 2,4,8] [--repeats 3] [--commit-mb 100] [--quick]
        [--scenarios kill,add] [--horovod auto|yes|no] [--kolo-python PATH] [--json PATH]

Not run in CI (tests/test_bench_scripts.py runs a tiny configuration). The ranks run
bench/_elastic_rank.py (a ~1 M-parameter linear model, ``DistributedOptimizer``, a
``TorchState`` commit after every step, under ``hvd.elastic.run``) as real processes of an
elastic job whose ``LaunchDriver`` runs in this process (tests/support/elastic_ranks.py: it
removes a rank's task when its process dies and adds tasks as a launcher does). The ranks print
``time.time()`` at each phase (one machine, one clock). For each size ``n``:

- kill: ``n`` ranks train; the last task is SIGKILLed. Phases, each up to the slowest survivor:
  detection (kill -> ``HorovodInternalError`` raised; of which "exit seen": kill -> the
  launcher's ``waitpid`` returned and it removed the task), reset (-> ``shutdown()`` + ``init()``
  done: restore, rendezvous of the smaller round), sync (-> ``TorchState.sync()`` done), first
  step (-> the first step of the new round completed); total kill -> first step.
- add: ``n - 1`` ranks train; a task is added (``add_tasks`` + its process started). Phases:
  notice (-> the running ranks' commit raised ``HostsUpdatedInterrupt``: kolo's driver
  announces the new task when it registers, so this includes its start), process start (-> the
  new process imported torch and kolo), rendezvous (from the later of the two -> every rank's
  ``init()`` of the new round done), new rank setup (-> it built its model, optimizer and
  ``TorchState``), sync, first step; total appearance -> the new rank's first step. kolo's
  line adds "survivor pause": what the running ranks lose, from the first of them leaving its
  round (its interrupted commit) to the last one's first step in the new round; the rest of
  the total they spent training.

Horovod 0.28.1, when bench/peers/horovod.sh built it (``--horovod auto``), is measured in the
same run, interleaved (kolo at ``n``, Horovod at ``n``, each repeat), with the same rank loop
(``bench/_elastic_rank.py --horovod``) under ``horovodrun --gloo --min-np --max-np
--host-discovery-script`` (bench/peers/_horovod.py) and the same phases; one machine plays two
hosts as in Horovod's own elastic tests (``localhost`` with the ranks that stay,
``127.0.0.1`` with the one killed or added: Horovod blacklists a failed worker's host). Its
add figures start at the discovery script's change and add a "discovery" phase (horovodrun
polls the script every second; kolo's bench adds the task directly). kolo's ranks then run on
the Horovod venv's python (``--kolo-python``), so both run on the same torch.

Each figure is the median over ``--repeats``. Then ``kolorun -np 2 bench/elastic_commit.py``
(one torch thread per rank) measures the commit (its JSON line is included): "save" is the copy
to host memory alone, "commit" adds the host-update check, one small broadcast that also
waits for the slower rank's save. Prints one line per scenario and size, the
targets' ratios (kill <= 1 s at 8 ranks, add <= 2 s, commit <= 1.5x memcpy), and writes JSON to
bench/results/ (or ``--json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from common import write_results  # noqa: E402
from peers import _horovod_beside as horovod_peer  # noqa: E402
from peers._horovod import (  # noqa: E402
    HorovodElasticJob,
    HorovodJobEnded,
    peer_versions,
)
from support.elastic_ranks import ElasticRanks, rank_env  # noqa: E402

RANK_SCRIPT = str(HERE / "_elastic_rank.py")
TARGETS = {"kill_s": 1.0, "add_s": 2.0, "commit_over_memcpy": 1.5}


def events(ranks: ElasticRanks, tasks: list[int], name: str, after: float) -> list[float]:
    """The time of each task's first ``name`` event (``a|b``: either) after ``after``."""
    names = name.split("|")
    times = []
    for task in tasks:
        line = ranks.wait_for(
            task,
            lambda x: (
                x.split(" ")[:2] in (["event", n] for n in names) and float(x.split()[2]) > after
            ),
            timeout=120,
        )
        times.append(float(line.split()[2]))
    return times


def steady(ranks: ElasticRanks, tasks: list[int], size: int) -> None:
    """Waits until every task completed a step in a round of ``size`` ranks, then a little
    longer (the loop is warm)."""
    for task in tasks:
        ranks.wait_for(
            task, lambda x: x.startswith("event step ") and x.endswith(f" {size}"), timeout=180
        )
    time.sleep(0.5)


def kolo_rank_env(python: str) -> dict[str, str]:
    """The ranks' environment: one torch thread each, and, when they run on another python
    than this one (the Horovod venv's, to share its torch), this process's kolo first on
    their path."""
    env = {"OMP_NUM_THREADS": "1"}
    if python != sys.executable:
        env["PYTHONPATH"] = horovod_peer.kolo_path()
    return env


def kill_once(n: int, width: int, python: str) -> dict[str, float]:
    """``n`` ranks, the last one SIGKILLed: the phases up to the survivors' first step."""
    rank = [python, RANK_SCRIPT, "--width", str(width)]
    with ElasticRanks(n, min_np=max(1, n - 1), max_np=n, env=kolo_rank_env(python)) as ranks:
        for task in range(n):
            ranks.start(task, rank)
        steady(ranks, list(range(n)), n)
        killed = ranks.kill(n - 1)
        survivors = list(range(n - 1))
        detected = max(events(ranks, survivors, "detected", killed))
        reset = max(events(ranks, survivors, "reset", killed))
        synced = max(events(ranks, survivors, "synced", killed))
        step = max(events(ranks, survivors, "step", killed))
        removed = ranks.ranks[n - 1].removed_at or killed
    return kill_phases(killed, removed, detected, reset, synced, step)


def kill_phases(
    killed: float, removed: float, detected: float, reset: float, synced: float, step: float
) -> dict[str, float]:
    """The kill scenario's phases from its event times (the same for kolo and Horovod)."""
    return {
        "exit_seen_s": removed - killed,
        "detection_s": detected - killed,
        "reset_s": reset - detected,
        "sync_s": synced - reset,
        "first_step_s": step - synced,
        "total_s": step - killed,
    }


def add_once(n: int, width: int, python: str) -> dict[str, float]:
    """``n - 1`` ranks, one task added: the phases up to the new rank's first step."""
    rank = [python, RANK_SCRIPT, "--width", str(width)]
    with ElasticRanks(n - 1, min_np=n - 1, max_np=n, env=kolo_rank_env(python)) as ranks:
        for task in range(n - 1):
            ranks.start(task, rank)
        steady(ranks, list(range(n - 1)), n - 1)
        appeared = time.time()
        ranks.add(n - 1, rank)
        running = list(range(n - 1))
        everyone = list(range(n))
        # A commit's HostsUpdatedInterrupt, or a failed collective when the new rank's
        # registration ended the round first.
        noticed = max(events(ranks, running, "interrupted|detected", appeared))
        up = events(ranks, [n - 1], "up", appeared)[0]
        reset = max(events(ranks, everyone, "reset", appeared))
        ready = events(ranks, [n - 1], "ready", appeared)[0]
        synced = max(events(ranks, everyone, "synced", appeared))
        step = events(ranks, [n - 1], "step", appeared)[0]
        interrupted = min(events(ranks, running, "interrupted|detected", appeared))
        resumed = max(events(ranks, running, "step", interrupted))
    phases = add_phases(appeared, noticed, up, reset, ready, synced, step)
    phases["survivor_pause_s"] = resumed - interrupted
    return phases


def add_phases(
    appeared: float,
    noticed: float,
    up: float,
    reset: float,
    ready: float,
    synced: float,
    step: float,
) -> dict[str, float]:
    """The add scenario's phases from its event times (the same for kolo and Horovod)."""
    return {
        "notice_s": noticed - appeared,
        "process_start_s": up - appeared,
        "rendezvous_s": reset - max(noticed, up),
        "new_rank_setup_s": max(ready - reset, 0.0),
        "sync_s": synced - max(reset, ready),
        "first_step_s": step - synced,
        "total_s": step - appeared,
    }


# Horovod: one machine plays two hosts as in Horovod's own elastic tests: "localhost" holds
# the ranks that stay, "127.0.0.1" the one that is killed or added. Horovod blacklists the host
# of a failed worker and ends the job when every host is blacklisted, so the killed rank must
# be alone on its host.
STAYING, MOVING = "localhost", "127.0.0.1"


def horovod_kill_once(python: Path, n: int, width: int) -> dict[str, float]:
    """Horovod's kill: ``n`` workers (``n - 1`` on one host, one on another), the lone one
    SIGKILLed; the same phases as :func:`kill_once` ("exit seen": horovodrun's driver logged
    the worker as failed), after "first detection" (kill -> the first survivor's
    ``HorovodInternalError``; "detection" is the last survivor's, as for kolo)."""
    survivors = [f"{STAYING}[{i}]" for i in range(n - 1)]
    victim = f"{MOVING}[0]"
    with HorovodElasticJob(
        python,
        [f"{STAYING}:{n - 1}", f"{MOVING}:1"],
        np=n,
        min_np=max(1, n - 1),
        max_np=n,
        rank_args=["--width", str(width)],
        env={"OMP_NUM_THREADS": "1"},
    ) as job:
        job.wait_steps([*survivors, victim], n)
        time.sleep(0.5)
        killed = job.kill(victim)
        detections = [job.wait_event(s, "detected", killed) for s in survivors]
        reset = max(job.wait_event(s, "reset", killed) for s in survivors)
        synced = max(job.wait_event(s, "synced", killed) for s in survivors)
        step = max(job.wait_event(s, "step", killed) for s in survivors)
        removed = job.exit_seen(MOVING, killed) or killed
    phases = kill_phases(killed, removed, max(detections), reset, synced, step)
    # The first survivor's detection too: in Horovod the others may wait for gloo's timeout.
    return {"first_detection_s": min(detections) - killed, **phases}


def horovod_add_once(python: Path, n: int, width: int) -> dict[str, float]:
    """Horovod's add: ``n - 1`` workers on one host; the discovery script starts listing a
    second host with one slot. The same phases as :func:`add_once`, after "discovery" (the
    new host's appearance -> the script's first answer naming it; horovodrun polls it every
    second). Horovod starts the new worker's process only once the running workers reached
    the new round's rendezvous, so its "process start" includes the notice."""
    running = [f"{STAYING}[{i}]" for i in range(n - 1)]
    new = f"{MOVING}[0]"
    with HorovodElasticJob(
        python,
        [f"{STAYING}:{n - 1}"],
        np=n - 1,
        min_np=n - 1,
        max_np=n,
        rank_args=["--width", str(width)],
        env={"OMP_NUM_THREADS": "1"},
    ) as job:
        job.wait_steps(running, n - 1)
        time.sleep(0.5)
        appeared = job.set_hosts([f"{STAYING}:{n - 1}", f"{MOVING}:1"])
        discovered = job.discovered(f"{MOVING}:1")
        noticed = max(job.wait_event(s, "interrupted|detected", appeared) for s in running)
        up = job.wait_event(new, "up", appeared)
        reset = max(job.wait_event(s, "reset", appeared) for s in [*running, new])
        ready = job.wait_event(new, "ready", appeared)
        synced = max(job.wait_event(s, "synced", appeared) for s in [*running, new])
        step = job.wait_event(new, "step", appeared)
    phases = add_phases(appeared, noticed, up, reset, ready, synced, step)
    return {"discovery_s": discovered - appeared, **phases}


def median_phases(samples: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(s[k] for s in samples), 4) for k in samples[0]}


def commit_figures(mb: float, repeats: int) -> dict[str, float]:
    """bench/elastic_commit.py's JSON line, on 2 ranks under kolorun."""
    script = [sys.executable, str(HERE / "elastic_commit.py"), "--mb", str(mb)]
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "kolorun"),
            "-np",
            "2",
            *script,
            "--repeats",
            str(repeats),
        ],
        cwd=HERE.parent,
        # One torch thread per rank (as bench/training.py): two ranks with two threads each on
        # two cores make every parallel copy wait for a descheduled thread.
        env=rank_env({"OMP_NUM_THREADS": "1"}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        raise RuntimeError(f"elastic_commit.py failed:\n{result.stdout}\n{result.stderr}")
    line = next(x for x in result.stdout.splitlines() if x.startswith("[0]<stdout>:{"))
    return json.loads(line.partition(":")[2])


def rank_torch(python: str) -> str:
    """The torch version ``python`` imports."""
    return subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()


def phases_text(phases: dict[str, float]) -> str:
    return " | ".join(f"{k[:-2].replace('_', ' ')} {v * 1e3:.0f} ms" for k, v in phases.items())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", default="2,4,8", help="job sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each scenario and size")
    parser.add_argument(
        "--scenarios", default="kill,add", help="which of kill,add to run, comma-separated"
    )
    parser.add_argument("--width", type=int, default=1000, help="model: width x width linear")
    parser.add_argument("--commit-mb", type=float, default=100.0, help="0: skip the commit bench")
    parser.add_argument("--quick", action="store_true", help="2 ranks, 1 repeat, a 10 MB commit")
    horovod_peer.add_arguments(parser, peer_flag=False)
    parser.add_argument(
        "--kolo-python",
        default=None,
        help="the python kolo's ranks run on (default: the Horovod venv's when Horovod is "
        "measured, so both run on the same torch; else this one)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sizes = [int(x) for x in args.ranks.split(",")]
    repeats, commit_mb = args.repeats, args.commit_mb
    if args.quick:
        sizes, repeats, commit_mb = [2], 1, min(commit_mb, 10.0)
    peer = horovod_peer.peer_python(args.horovod, "elastic")
    kolo_python = args.kolo_python or (str(peer) if peer is not None else sys.executable)
    ours = {"python": kolo_python, "torch": rank_torch(kolo_python)}
    print(f"kolo ranks: torch {ours['torch']} ({kolo_python})", flush=True)
    if peer is not None:
        versions = peer_versions(peer)
        print(f"horovod {versions['horovod']} ranks: torch {versions['torch']} ({peer})")

    results, peer_results = [], []
    for n in sizes:
        for scenario, once, peer_once in (
            ("kill", kill_once, horovod_kill_once),
            ("add", add_once, horovod_add_once),
        ):
            if scenario not in args.scenarios.split(","):
                continue
            samples, peer_samples, peer_failures = [], [], []
            for _ in range(repeats):  # interleaved: both see the same machine load
                samples.append(once(n, args.width, kolo_python))
                if peer is not None:
                    try:
                        peer_samples.append(peer_once(peer, n, args.width))
                    except HorovodJobEnded as ended:  # a figure too: it did not recover
                        peer_failures.append(ended.reason)
                        print(f"horovod {scenario} {n} ranks: the job ended: {ended.reason}")
            phases = median_phases(samples)
            target = TARGETS[f"{scenario}_s"]
            results.append({"scenario": scenario, "ranks": n, **phases})
            print(
                f"elastic {scenario} {n} ranks: {phases_text(phases)} "
                f"| {phases['total_s'] / target:.2f}x target {target:g} s",
                flush=True,
            )
            if peer is not None:
                row = {"scenario": scenario, "ranks": n, "runs": repeats}
                row["jobs_ended"] = peer_failures
                failed = f" | {len(peer_failures)} of {repeats} jobs ended" if peer_failures else ""
                if peer_samples:
                    theirs = median_phases(peer_samples)
                    ratio = theirs["total_s"] / phases["total_s"]
                    row.update(theirs, horovod_over_kolo=ratio)
                    print(
                        f"horovod {scenario} {n} ranks: {phases_text(theirs)} "
                        f"| {ratio:.1f}x kolo's total{failed}",
                        flush=True,
                    )
                else:
                    print(f"horovod {scenario} {n} ranks: no recovery{failed}", flush=True)
                peer_results.append(row)
    payload = {
        "width": args.width,
        "params": args.width * args.width + args.width,
        "repeats": repeats,
        "targets": TARGETS,
        "kolo_ranks": ours,
        "results": results,
    }
    if peer is not None:
        payload["horovod"] = {**versions, "results": peer_results}
    if commit_mb > 0:
        commit = commit_figures(commit_mb, max(3, repeats))
        ratio = commit["commit_over_memcpy"]
        save_ratio = commit["save_s"] / commit["memcpy_s"]
        print(
            f"elastic commit {commit['state_mb']} MB: save {commit['save_s'] * 1e3:.1f} ms, "
            f"commit {commit['commit_s'] * 1e3:.1f} ms, memcpy {commit['memcpy_s'] * 1e3:.1f} ms "
            f"| save/memcpy {save_ratio:.2f}x | commit/memcpy {ratio:.2f}x "
            f"| {ratio / TARGETS['commit_over_memcpy']:.2f}x target",
            flush=True,
        )
        payload["commit"] = commit
    write_results("elastic", payload, args.json)


if __name__ == "__main__":
    main()
