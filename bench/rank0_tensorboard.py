"""Rank 0's TensorBoard start before the first step of a torch estimator fit: a baseline tree's
kolo vs this tree's, interleaved.

Each run is a fresh process (as a rank process is): ``import torch``, ``kolo.torch`` as one bare
rank, then the trainer's ``_tensorboard`` (``torch.utils.tensorboard.SummaryWriter`` on a local
directory of a real local store) and one scalar written; the figure is that last part's wall
time, and whether it loaded TensorFlow. Runs alternate between the trees; the figures are
medians.

Example::

    .venv/bin/python bench/rank0_tensorboard.py --compare-with /tmp/kolo-main/python --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, tempfile, time, types

import torch  # noqa: F401 - a rank has torch before its writer starts

import kolo.torch as hvd
from kolo.estimator.torch_trainer import TorchTrainer
from kolo.store import Store

hvd.init()
trainer = TorchTrainer.__new__(TorchTrainer)
trainer.spec = types.SimpleNamespace(store=Store.create(sys.argv[1]), run_id="bench")
started = time.perf_counter()
writer, _, _ = trainer._tensorboard(hvd)
writer.add_scalar("loss", 0.5, 0)
writer.flush()
seconds = time.perf_counter() - started
writer.close()
print("RESULT " + json.dumps({"s": seconds, "tensorflow": "tensorflow" in sys.modules}))
hvd.shutdown()
"""


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--compare-with", type=Path, required=True, help="baseline python/ dir")
    parser.add_argument("--runs", type=int, default=5, help="runs per tree")
    return parser.parse_args(argv)


def one_run(tree: Path, store: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KOLO_", "HOROVOD_"))}
    env["PYTHONPATH"] = str(tree)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, store], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"run in {tree} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(lines[-1][len("RESULT ") :])


def main(argv: Optional[list[str]] = None) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    from common import write_results

    args = parse_args(argv)
    trees = {"baseline": args.compare_with.resolve(), "this": REPO / "python"}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="kolo-bench-tb-") as store:
        for run in range(args.runs):
            for name in list(trees) if run % 2 == 0 else list(trees)[::-1]:
                runs[name].append(one_run(trees[name], os.path.join(store, f"{name}-{run}")))
            print(
                f"run {run}: "
                + ", ".join(
                    f"{n} {runs[n][-1]['s']:.2f} s (TensorFlow loaded: {runs[n][-1]['tensorflow']})"
                    for n in trees
                ),
                flush=True,
            )
    medians = {name: statistics.median(r["s"] for r in values) for name, values in runs.items()}
    print(
        f"rank 0 TensorBoard writer start, median of {args.runs}: baseline "
        f"{medians['baseline']:.2f} s, this tree {medians['this']:.2f} s -> ratio "
        f"{medians['this'] / medians['baseline']:.3f}",
        flush=True,
    )
    write_results(
        "rank0_tensorboard", {"baseline": str(trees["baseline"]), "runs": runs, "median_s": medians}
    )


if __name__ == "__main__":
    main()
