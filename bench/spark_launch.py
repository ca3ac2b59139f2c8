"""Launch to first step: ``kolo.spark.run`` vs PySpark's ``TorchDistributor``, interleaved in
one ``local[2]`` Spark session, with kolo's launch broken down.

kolo runs two ways in each round: ``kolo warm`` (the default: the executor's warm rank server,
started by the application's first launch, forks the ranks; python/kolo/spark/_warm_server.py)
and ``kolo fresh`` (``KOLO_SPARK_WARM_START=0``: a new interpreter per rank, which imports
torch). Each round also times an empty barrier stage of 2 tasks (``spark_floor``: submit to
collect, what Spark's scheduling of the stage costs before kolo does anything), the floor
under any launch; the report gives kolo's share above it.

Each side runs, on 2 ranks, a function that imports torch, initialises its collectives (kolo:
``import kolo.torch as hvd; hvd.init()``; the peer: ``torch.distributed`` gloo, which
``TorchDistributor`` sets up with ``torchrun``) and runs one allreduce of 4 floats: its first
step. The figure is the time from the launch call to the moment the last rank finished that
allreduce. Rounds alternate which side goes first; the figures are medians over rounds, after
one warm-up launch each (whose kolo breakdown is printed too: the application's first launch
starts the Python workers).

kolo's breakdown comes from the times the launch records (``kolo.spark.run(...,
_on_launch_report=...)``, see ``python/kolo/spark/_launch_report.py``): the phases up to every
rank's function starting, then the function's own: ``torch_import``, ``kolo_init``
(``import kolo.torch`` and ``hvd.init()``: the data-plane rendezvous) and ``first_collective``.
Each phase ends when the last rank passed it, so the phases add up to the total.

``--compare-with <tree>/python`` measures before/after instead: fresh applications (each a
child process of this script) alternate between a baseline tree's kolo and this one, each
timing its first launch (what a ``spark-submit`` of a training script pays) and ``--rounds``
later ones.

Example::

    .venv/bin/python bench/spark_launch.py --rounds 5
    .venv/bin/python bench/spark_launch.py --compare-with /tmp/kolo-main/python --apps 3 --rounds 2
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from common import write_results  # noqa: E402
from support.spark import local_session_builder  # noqa: E402

import kolo.spark  # noqa: E402
from kolo.exceptions import TimeoutError as KoloTimeoutError  # noqa: E402
from kolo.spark._warm_start import (  # noqa: E402
    DIR_VAR,
    WARM_START_VAR,
    serving,
    stop_server,
    wait_for_server,
)

#: The function's own phases, after the launch report's: (phase, the time that ends it).
FN_PHASES = (
    ("torch_import", "torch_imported"),
    ("kolo_init", "initialised"),
    ("first_collective", "first_step"),
)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (after a warm-up)")
    parser.add_argument(
        "--no-distributor", action="store_true", help="kolo only (no TorchDistributor rounds)"
    )
    parser.add_argument(
        "--compare-with",
        type=Path,
        default=None,
        help="a baseline tree's python/ dir (e.g. main's): instead of the run above, fresh Spark "
        "applications alternate between it and this tree, each timing its first launch and "
        "--rounds more (kolo only)",
    )
    parser.add_argument(
        "--apps", type=int, default=3, help="applications per tree (--compare-with)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None, help="results file")
    return parser.parse_args(argv)


def child_main(args: argparse.Namespace) -> None:
    """One fresh application (``--child``): its first launch and ``--rounds`` more, as JSON."""
    session = local_session_builder().appName("kolo-bench-spark-launch").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    first = kolo_launch(session)
    later = [kolo_launch(session) for _ in range(args.rounds)]
    print("RESULT " + json.dumps({"first": first, "later": later}), flush=True)
    session.stop()


def compare_main(args: argparse.Namespace) -> None:
    """Fresh applications alternating between the baseline tree and this one."""
    trees = {"baseline": args.compare_with.resolve(), "this": REPO / "python"}
    apps: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for app in range(args.apps):
        names = list(trees) if app % 2 == 0 else list(trees)[::-1]
        for name in names:
            env = {**os.environ, "PYTHONPATH": str(trees[name])}
            child = [sys.executable, __file__, "--child", "--rounds", str(args.rounds)]
            done = subprocess.run(child, env=env, capture_output=True, text=True, timeout=900)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode != 0 or not lines:
                raise SystemExit(f"{name} application failed:\n{done.stdout}\n{done.stderr}")
            apps[name].append(json.loads(lines[-1][len("RESULT ") :]))
            figures = apps[name][-1]
            print(
                f"app {app} {name:8s}: first launch {figures['first']['total_s']:.2f} s, later "
                + ", ".join(f"{run['total_s']:.2f}" for run in figures["later"]),
                flush=True,
            )
    first = {n: statistics.median(a["first"]["total_s"] for a in runs) for n, runs in apps.items()}
    later = {
        n: statistics.median(r["total_s"] for a in runs for r in a["later"])
        for n, runs in apps.items()
    }
    print(
        f"first launch of an application to first step, median of {args.apps}: baseline "
        f"{first['baseline']:.2f} s, this tree {first['this']:.2f} s -> ratio "
        f"{first['this'] / first['baseline']:.2f}",
        flush=True,
    )
    print(
        f"later launches to first step, median of {args.apps}x{args.rounds}: baseline "
        f"{later['baseline']:.2f} s, this tree {later['this']:.2f} s -> ratio "
        f"{later['this'] / later['baseline']:.2f}",
        flush=True,
    )
    phases = [a["first"]["phases_s"] for a in apps["this"] if "phases_s" in a["first"]]
    if phases:
        print_breakdown(
            "this tree's first launch, median phases",
            {name: statistics.median(p[name] for p in phases) for name in phases[0]},
        )
    write_results(
        "spark_launch_compare",
        {
            "baseline": str(trees["baseline"]),
            "apps": apps,
            "first_median_s": first,
            "later_median_s": later,
        },
        args.json,
    )


def kolo_first_step() -> dict[str, float]:
    """A kolo rank: import torch, ``hvd.init()``, one allreduce; the times it passed each."""
    import time

    times = {"fn_started": time.time()}
    import torch

    times["torch_imported"] = time.time()
    import kolo.torch as hvd

    hvd.init()
    times["initialised"] = time.time()
    hvd.allreduce(torch.ones(4), name="first_step")
    times["first_step"] = time.time()
    return times


def distributor_first_step() -> dict[str, float]:
    """A TorchDistributor rank: import torch, gloo process group, one allreduce."""
    import time

    times = {"fn_started": time.time()}
    import torch
    import torch.distributed as dist

    times["torch_imported"] = time.time()
    dist.init_process_group("gloo")
    times["initialised"] = time.time()
    dist.all_reduce(torch.ones(4))
    times["first_step"] = time.time()
    # Every rank's first step, so the figure is when the last rank finished it (as kolo's).
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, times["first_step"])
    dist.destroy_process_group()
    times["first_step"] = max(gathered)
    return times


def reports_launches() -> bool:
    """Whether this kolo's ``kolo.spark.run`` hands out a launch report (a baseline tree run
    with ``--child`` may predate it: then only its total is measured)."""
    return "_on_launch_report" in inspect.signature(kolo.spark.run).parameters


def kolo_launch(session: Any) -> dict[str, Any]:
    """One ``kolo.spark.run``: its total and its breakdown (phase -> seconds)."""
    reports: list[Any] = []
    extra = {"_on_launch_report": reports.append} if reports_launches() else {}
    called = time.time()
    ranks = kolo.spark.run(kolo_first_step, num_proc=2, spark=session, **extra)
    if not reports:
        return {"total_s": max(rank["first_step"] for rank in ranks) - called}
    report = reports[0]
    points = report.milestones()
    for name, key in FN_PHASES:
        points.append((name, max(max(rank[key] for rank in ranks), points[-1][1])))
    phases = {name: at - points[i][1] for i, (name, at) in enumerate(points[1:])}
    return {
        "total_s": points[-1][1] - called,
        "phases_s": phases,
        "complete": report.complete(),
        "warm_ranks": len(report.warm_ranks()) if hasattr(report, "warm_ranks") else 0,
    }


def kolo_fresh_launch(session: Any) -> dict[str, Any]:
    """One ``kolo.spark.run`` with warm start off (every rank a new interpreter)."""
    old = os.environ.get(WARM_START_VAR)
    os.environ[WARM_START_VAR] = "0"
    try:
        return kolo_launch(session)
    finally:
        if old is None:
            del os.environ[WARM_START_VAR]
        else:
            os.environ[WARM_START_VAR] = old


def barrier_stage_tasks_started() -> list[float]:
    import time

    return [time.time()]


def spark_floor(session: Any) -> dict[str, Any]:
    """An empty barrier stage of 2 tasks: submit to collect (the Spark floor of a launch)."""
    called = time.time()
    rdd = session.sparkContext.parallelize(range(2), 2).barrier()
    started = rdd.mapPartitions(lambda _: barrier_stage_tasks_started()).collect()
    return {"total_s": time.time() - called, "tasks_started_s": max(started) - called}


def wait_for_warm_server(directory: str, timeout: float = 120.0) -> Optional[dict]:
    """The warm rank server of this application's executor (in this bench's own
    ``KOLO_SPARK_WARM_DIR``) once it serves (None: none came up; the error is printed)."""
    try:
        return wait_for_server(directory, timeout)[1]
    except KoloTimeoutError as error:
        print(error, flush=True)
        return None


def distributor_launch() -> dict[str, Any]:
    """One ``TorchDistributor(num_processes=2, local_mode=False).run``: its total."""
    from pyspark.ml.torch.distributor import TorchDistributor

    called = time.time()
    times = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        distributor_first_step
    )
    return {"total_s": times["first_step"] - called}


def print_breakdown(title: str, phases: dict[str, float]) -> None:
    total = sum(phases.values())
    print(f"{title}: {total:.3f} s", flush=True)
    for name, seconds in phases.items():
        share = seconds / total if total else 0.0
        print(f"  {name:18s} {seconds:7.3f} s  {share:6.1%}", flush=True)


def main(argv: Optional[list[str]] = None) -> None:
    import cloudpickle

    args = parse_args(argv)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if args.child:
        return child_main(args)
    if args.compare_with is not None:
        return compare_main(args)
    # The servers of this run live in a directory of their own (stopped at the end).
    warm_dir = tempfile.mkdtemp(prefix="kolo-bench-warm-")
    os.environ[DIR_VAR] = warm_dir
    load_before = os.getloadavg()
    # The servers of this run live in a directory of their own (stopped at the end).
    warm_dir = tempfile.mkdtemp(prefix="kolo-bench-warm-")
    os.environ[DIR_VAR] = warm_dir
    load_before = os.getloadavg()
    session = local_session_builder().appName("kolo-bench-spark-launch").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    first = kolo_launch(session)
    print_breakdown(
        "kolo's first launch in this application to first step (fresh ranks, starts the Python "
        "workers and the warm rank server)",
        first["phases_s"],
    )
    server = wait_for_warm_server(warm_dir)
    if server is None:
        print("no warm rank server came up: the kolo warm rounds run fresh ranks", flush=True)
    else:
        print(
            f"warm rank server {server['pid']}: pre-imported {sorted(server['modules'])} in "
            f"{server['import_seconds']} s",
            flush=True,
        )
    sides = {
        "kolo warm": lambda: kolo_launch(session),
        "kolo fresh": lambda: kolo_fresh_launch(session),
        "spark_floor": lambda: spark_floor(session),
    }
    if not args.no_distributor:
        sides["TorchDistributor"] = distributor_launch
        sides["TorchDistributor"]()  # its own warm-up (not counted)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for round_ in range(args.rounds):
        names = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
        for name in names:
            runs[name].append(sides[name]())
        print(
            f"round {round_}: "
            + ", ".join(f"{n} {runs[n][-1]['total_s']:.2f} s" for n in sides)
            + f" (warm ranks: {runs['kolo warm'][-1]['warm_ranks']})",
            flush=True,
        )
    medians = {
        name: statistics.median(r["total_s"] for r in rounds) for name, rounds in runs.items()
    }
    phase_medians = {}
    for side in ("kolo warm", "kolo fresh"):
        names = list(dict.fromkeys(n for r in runs[side] for n in r["phases_s"]))
        phase_medians[side] = {
            name: statistics.median(r["phases_s"].get(name, 0.0) for r in runs[side])
            for name in names
        }
        print_breakdown(
            f"{side} launch to first step, median phases of {args.rounds}", phase_medians[side]
        )
    warm_s, fresh_s, floor_s = medians["kolo warm"], medians["kolo fresh"], medians["spark_floor"]
    floor_started = statistics.median(r["tasks_started_s"] for r in runs["spark_floor"])
    print(
        f"empty barrier stage: every task started {floor_started:.3f} s after submission "
        f"(kolo warm's spark_scheduling: {phase_medians['kolo warm']['spark_scheduling']:.3f} s), "
        f"rows back at {floor_s:.3f} s",
        flush=True,
    )
    print(
        f"launch to first step (2 ranks), median of {args.rounds}: kolo warm {warm_s:.2f} s, "
        f"kolo fresh {fresh_s:.2f} s, first launch {first['total_s']:.2f} s; empty barrier "
        f"stage {floor_s:.2f} s (kolo warm above it: {warm_s - floor_s:.2f} s, "
        f"{(warm_s - floor_s) / warm_s:.0%} of its launch) (target <= 1.5 s: "
        f"{'met' if warm_s <= 1.5 else 'not met'})",
        flush=True,
    )
    payload: dict[str, Any] = {
        "rounds": args.rounds,
        "median_s": medians,
        "kolo_phase_medians_s": phase_medians,
        "kolo_first_launch": first,
        "warm_server": server,
        "runs": runs,
        "target_s": 1.5,
        "ratio_warm_over_fresh": warm_s / fresh_s,
        "spark_floor_tasks_started_median_s": floor_started,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    print(
        f"load average (1, 5, 15 min) before {load_before}, after {payload['loadavg_after']} "
        f"on {os.cpu_count()} CPUs",
        flush=True,
    )
    if "TorchDistributor" in medians:
        td = medians["TorchDistributor"]
        payload["ratio_warm_over_distributor"] = warm_s / td
        payload["ratio_fresh_over_distributor"] = fresh_s / td
        print(
            f"TorchDistributor {td:.2f} s -> ratios kolo warm/TD {warm_s / td:.2f}, kolo fresh/TD "
            f"{fresh_s / td:.2f}, kolo warm/fresh {warm_s / fresh_s:.2f}",
            flush=True,
        )
    write_results("spark_launch", payload, args.json)
    for slot, _ in serving(warm_dir):
        stop_server(slot, 10.0)
    session.stop()


if __name__ == "__main__":
    main()
