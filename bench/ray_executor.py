"""Ray benchmark: kolo's RayExecutor vs Ray Train's TorchTrainer, and kolo's loader vs Ray
Data's ``iter_torch_batches``, interleaved in one Ray job (same worker count).

    python bench/ray_executor.py [--workers 2] [--rounds 2] [--runs 20] [--rows 200000]

Figures (median over rounds; the rounds alternate which side goes first):

- **start**: kolo: from ``RayExecutor.start()`` until a first ``run`` has its function
  running on every rank with ``hvd.init()`` returned (the ranks' mesh connected); Ray Train:
  from ``TorchTrainer.fit()`` until the train loop function runs on every worker (its
  process group is set up before the loop starts). Both from timestamps taken inside the
  workers (``time.time()``, one machine), the latest rank counting.
- **per-run overhead**: kolo: wall time of ``executor.run(fn)`` for an empty ``fn`` (median of
  ``--runs`` calls on a started executor). Ray Train has no persistent workers to run a
  function on, so its "run" is a whole ``TorchTrainer(empty loop).fit()`` (median of
  ``--train-fits``) — what running one more function costs there.
- **epoch throughput** (samples/s, all ranks): the same Parquet files (written once by
  ``kolo.data.prepare_data``, no dictionary encoding), the same MLP, batch size and SGD;
  kolo: ``kolo.data.ParquetLoader`` in RayExecutor workers with ``hvd.DistributedOptimizer``;
  peer: ``ray.data.read_parquet`` → ``TorchTrainer(datasets=...)``, ``get_dataset_shard`` →
  ``iter_torch_batches`` with Ray Train's ``prepare_model`` (DDP). Rows of the epoch over
  the slowest rank's epoch time; ``--epochs`` epochs, the last one counted (warm).

Targets (issue 6): start <= 0.5x TorchTrainer's; epoch throughput >= 2x the Ray Data feed.
Prints one line per figure with the ratio, and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np
from common import write_results

FEATURES = 32
CLASSES = 10


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20, help="empty runs per kolo round")
    parser.add_argument("--train-fits", type=int, default=2, help="empty fits per Ray round")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--num-cpus",
        type=int,
        default=4,
        help="logical CPUs for ray.init (Ray Train's "
        "controller and Ray Data's read tasks need some beside the workers)",
    )
    parser.add_argument("--json", type=Path, default=None, help="results file")
    return parser.parse_args(argv)


def make_model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, CLASSES),
    )


def write_dataset(folder: str, rows: int, workers: int) -> str:
    """``rows`` rows of a (FEATURES,) float32 array and an int label as plain Parquet."""
    import pyarrow as pa

    from kolo.data import prepare_data

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, FEATURES), dtype=np.float32)
    y = (x[:, :CLASSES].argmax(axis=1)).astype(np.int64)
    table = pa.table(
        {
            "features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), FEATURES),
            "label": pa.array(y),
        }
    )
    prepared = prepare_data(
        folder,
        table,
        feature_columns=["features"],
        label_columns=["label"],
        num_processes=workers,
        partitions_per_process=4,
    )
    path = prepared.train_path
    return path[len("file://") :] if path.startswith("file://") else path


# -- what runs in the workers -------------------------------------------------------------------


def _kolo_init_stamp() -> float:
    import kolo.torch as hvd

    hvd.init()
    return time.time()


def _empty() -> None:
    return None


def _kolo_epochs(path: str, batch_size: int, epochs: int) -> dict[str, Any]:
    import torch

    import kolo.torch as hvd
    from kolo.data import ParquetLoader

    hvd.init()
    torch.set_num_threads(1)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loader = ParquetLoader(path, ["features", "label"], batch_size=batch_size, seed=0)
    result = _timed_epochs(model, optimizer, lambda: loader, epochs)
    loader.close()
    return result


def _timed_epochs(
    model: Any, optimizer: Any, batches: Callable[[], Iterable[dict[str, Any]]], epochs: int
) -> dict[str, list]:
    """Trains ``epochs`` epochs over ``batches()`` (one call per epoch); returns each epoch's
    seconds and rows seen on this rank."""
    import torch

    loss_fn = torch.nn.functional.cross_entropy
    times, rows = [], []
    for _ in range(epochs):
        began, seen = time.perf_counter(), 0
        for batch in batches():
            optimizer.zero_grad()
            loss_fn(model(batch["features"]), batch["label"]).backward()
            optimizer.step()
            seen += batch["label"].shape[0]
        times.append(time.perf_counter() - began)
        rows.append(seen)
    return {"seconds": times, "rows": rows}


def _stamp_file(folder: str, name: str, payload: dict[str, Any]) -> None:
    with open(os.path.join(folder, f"{name}.json"), "w") as out:
        json.dump(payload, out)


def _train_loop(config: dict[str, Any]) -> None:
    """Ray Train's loop: stamps its start; with a dataset, trains ``epochs`` epochs on it."""
    import ray.train
    import torch

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    started = time.time()
    result: dict[str, Any] = {"started": started}
    if config.get("train"):
        import ray.train.torch

        torch.set_num_threads(1)
        model = ray.train.torch.prepare_model(make_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        shard = ray.train.get_dataset_shard("train")

        def batches() -> Any:
            return shard.iter_torch_batches(batch_size=config["batch_size"], drop_last=True)

        result.update(_timed_epochs(model, optimizer, batches, config["epochs"]))
    _stamp_file(config["folder"], f"rank{rank}", result)


# -- the two sides ---------------------------------------------------------------------------


def kolo_round(args: argparse.Namespace, path: str) -> dict[str, Any]:
    from kolo.ray import RayExecutor

    settings = RayExecutor.create_settings(timeout_s=120, nics=["lo"])
    executor = RayExecutor(settings, num_workers=args.workers)
    began = time.time()
    executor.start()
    stamps = executor.run(_kolo_init_stamp)
    start_s = max(stamps) - began
    overheads = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        executor.run(_empty)
        overheads.append(time.perf_counter() - t0)
    epochs = executor.run(_kolo_epochs, args=[path, args.batch_size, args.epochs])
    executor.shutdown()
    return {
        "start_s": start_s,
        "start_call_s": executor.start_seconds,
        "run_overhead_s": statistics.median(overheads),
        "throughput": _throughput(epochs),
        "epochs": epochs,
    }


def ray_train_round(args: argparse.Namespace, path: str, storage: str) -> dict[str, Any]:
    import ray.data
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def fit(config: dict[str, Any], datasets: Optional[dict] = None) -> tuple[float, list]:
        folder = tempfile.mkdtemp(prefix="kolo-bench-raytrain-")
        config = dict(config, folder=folder)
        trainer = TorchTrainer(
            _train_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
            run_config=RunConfig(storage_path=storage, name=f"bench-{time.time_ns()}"),
            datasets=datasets,
        )
        began = time.time()
        trainer.fit()
        ended = time.time()
        stamps = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("rank*.json"))]
        if len(stamps) != args.workers:
            raise RuntimeError(f"Ray Train: {len(stamps)} of {args.workers} workers stamped")
        for stamp in stamps:
            stamp["fit_began"], stamp["fit_ended"] = began, ended
        return ended - began, stamps

    total, stamps = fit({})
    start_s = max(s["started"] for s in stamps) - stamps[0]["fit_began"]
    overheads = [total] + [fit({})[0] for _ in range(max(0, args.train_fits - 1))]
    dataset = ray.data.read_parquet(path)
    _, trained = fit(
        {"train": True, "epochs": args.epochs, "batch_size": args.batch_size},
        datasets={"train": dataset},
    )
    epochs = [{"seconds": s["seconds"], "rows": s["rows"]} for s in trained]
    return {
        "start_s": start_s,
        "run_overhead_s": statistics.median(overheads),
        "throughput": _throughput(epochs),
        "epochs": epochs,
    }


def _throughput(per_rank: list[dict[str, Any]]) -> float:
    """Rows of the last epoch (all ranks) over the slowest rank's time for it."""
    rows = sum(r["rows"][-1] for r in per_rank)
    seconds = max(r["seconds"][-1] for r in per_rank)
    return rows / seconds


#: The printed figures: (key in figures, name, scale, unit, which is better, target).
REPORT = (
    ("start_s", "start", 1, "s", "lower", "<= 0.5"),
    (
        "run_overhead_s",
        "per-run overhead",
        1e3,
        "ms",
        "lower",
        "none; Ray Train's run is a whole empty fit",
    ),
    ("throughput", "epoch throughput", 1, "samples/s", "higher", ">= 2"),
)


def _line(name: str, kolo: float, peer: float, unit: str, better: str, target: str) -> str:
    ratio = kolo / peer if peer else float("inf")
    return (
        f"{name}: kolo {kolo:.4g} {unit}, Ray Train {peer:.4g} {unit}, ratio kolo/Ray "
        f"{ratio:.3g} ({better} is better; target {target})"
    )


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    import ray

    logging.getLogger("ray").setLevel(logging.ERROR)
    os.environ.setdefault("RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS", "0")
    ray.init(
        num_cpus=args.num_cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        logging_level="ERROR",
        log_to_driver=False,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kolo-bench-ray-") as folder:
        path = write_dataset(os.path.join(folder, "store"), args.rows, args.workers)
        storage = os.path.join(folder, "ray-train")
        sides: dict[str, Callable[[], dict[str, Any]]] = {
            "kolo": lambda: kolo_round(args, path),
            "ray_train": lambda: ray_train_round(args, path, storage),
        }
        rounds: dict[str, list[dict[str, Any]]] = {"kolo": [], "ray_train": []}
        for index in range(args.rounds):
            order = ["kolo", "ray_train"] if index % 2 == 0 else ["ray_train", "kolo"]
            for name in order:
                figures = sides[name]()
                rounds[name].append(figures)
                print(
                    f"round {index} {name}: start {figures['start_s']:.3f} s, run overhead "
                    f"{figures['run_overhead_s'] * 1e3:.1f} ms, epoch "
                    f"{figures['throughput']:.0f} samples/s",
                    flush=True,
                )
    ray.shutdown()

    def median(side: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds[side])

    figures = {
        key: {"kolo": median("kolo", key), "ray_train": median("ray_train", key)}
        for key in ("start_s", "run_overhead_s", "throughput")
    }
    for values in figures.values():
        values["ratio"] = values["kolo"] / values["ray_train"]
    for key, name, scale, unit, better, target in REPORT:
        values = figures[key]
        print(
            _line(name, values["kolo"] * scale, values["ray_train"] * scale, unit, better, target),
            flush=True,
        )
    write_results(
        "ray_executor",
        {
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "ray_version": ray.__version__,
            "loadavg_at_start": load,
            "loadavg_at_end": os.getloadavg(),
            "figures": figures,
            "rounds": rounds,
            "targets": {"start_ratio_max": 0.5, "throughput_ratio_min": 2.0},
            "met": {
                "start": figures["start_s"]["ratio"] <= 0.5,
                "throughput": figures["throughput"]["ratio"] >= 2.0,
            },
        },
        args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
