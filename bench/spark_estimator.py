"""Spark estimator benchmark: kolo's TorchEstimator vs PySpark's TorchDistributor, and
TorchModel.transform vs hand-written inference, interleaved in one Spark session.

    python bench/spark_estimator.py [--rows 100000] [--features 32] [--epochs 2] [--rounds 2]
        [--horovod auto|yes|no]

Training (same data, same MLP, same batch size, 2 ranks on local Spark, CPU):
- kolo: ``TorchEstimator(num_proc=2, store=<local dir>).fit(df)``; the figures are the time
  from the launch (``kolo.spark.run``) to the first training step, from the ``fit`` call to
  it, the total, and its parts (prepare, launch, train, checkpoint, model return) from the
  model's ``getTimings()``.
- peer: the DataFrame written as Parquet by Spark, then ``TorchDistributor(num_processes=2,
  local_mode=False)`` running a hand-written gloo DDP loop over a pyarrow loader; its launch
  is the ``TorchDistributor.run`` call.
- Horovod 0.28.1 (``--horovod auto``: when bench/peers/horovod.sh built its venv, with
  ``--spark`` for Horovod's Spark requirements): ``horovod.spark.torch.TorchEstimator(num_proc=2,
  store=LocalStore(<local dir>))`` on the same data (same seeds), model, optimizer, loss, batch
  size and epochs, in its own local[2] Spark session run by this script with the peer venv's
  python (``--horovod-peer``, bench/peers/_horovod_beside.py), once per round beside kolo's fit.
  Its figure is the total fit time (its estimator reports no first step); kolo's total over it
  is printed. Horovod's labels arrive as float tensors: its loss casts them to class indices.
Inference (rows/s over the same DataFrame, forced with Spark's ``noop`` sink):
- kolo ``TorchModel.transform``; peers: Horovod's row-by-row ``mapPartitions`` and a
  hand-written batched ``mapInPandas``.
Rounds alternate the order of kolo and its peer; the figure is the median over rounds. Prints
one line per figure with the ratio, and writes JSON to bench/results/. Targets (issue 5):
launch-to-first-step <= 5 s and <= 0.5x TorchDistributor's; transform >= 20x row-by-row and
>= 1x mapInPandas.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import cloudpickle
import numpy as np
import spark_peers
import torch
import torch.nn.functional as F
from common import write_results
from peers import _horovod_beside as horovod_peer
from spark_peers import batched_pandas, make_model, row_by_row
from torch import nn

# Spark tasks do not have bench/ on their path: ship the peers' code by value.
cloudpickle.register_pickle_by_value(spark_peers)

CLASSES = 10


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--transform-rows", type=int, default=400_000)
    parser.add_argument("--json", type=Path, default=None, help="results file")
    horovod_peer.add_arguments(parser)
    return parser.parse_args(argv)


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("kolo-bench-spark-estimator")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def make_frame(spark: Any, rows: int, features: int, seed: int) -> Any:
    """A classification DataFrame: ``features`` (Spark ML vector), ``label`` (double)."""
    import pandas as pd
    from pyspark.ml.feature import VectorAssembler

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, features)).astype(np.float32)
    w = np.random.default_rng(0).standard_normal((features, CLASSES)).astype(np.float32)
    y = (x @ w).argmax(axis=1).astype(np.float64)
    names = [f"x{i}" for i in range(features)]
    frame = pd.DataFrame(x, columns=names)
    frame["label"] = y
    df = spark.createDataFrame(frame).repartition(2)
    assembled = VectorAssembler(inputCols=names, outputCol="features").transform(df)
    return assembled.select("features", "label").cache()


def fit_kolo(df: Any, args: argparse.Namespace, store_dir: str, run: int) -> dict[str, float]:
    from kolo.spark.common.store import Store
    from kolo.spark.torch import TorchEstimator

    model = make_model(args.features, CLASSES)
    estimator = TorchEstimator(
        num_proc=2,
        store=Store.create(os.path.join(store_dir, f"kolo-{run}")),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=args.lr),
        loss=nn.CrossEntropyLoss(),
        feature_cols=["features"],
        label_cols=["label"],
        batch_size=args.batch_size,
        epochs=args.epochs,
        verbose=0,
        random_seed=0,
    )
    start = time.time()
    fitted = estimator.fit(df)
    total = time.time() - start
    parts = fitted.getTimings()
    figures = {"total_s": total, "first_step_s": parts["first_step"] - start}
    figures.update({f"{name}_s": value for name, value in parts["parts"].items()})
    # kolo.spark.run's launch report: launch -> every rank's trainer started, then the
    # trainer's own set-up (torch model, hvd.init, loaders, broadcasts) until the first step.
    phases = parts.get("launch_phases", {})
    figures.update({f"launch.{name}_s": value for name, value in phases.items()})
    figures["_model"] = fitted  # type: ignore[assignment]
    return figures


def horovod_loss(output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """Cross-entropy as kolo's fit computes it: Horovod's estimator hands labels over as float
    tensors, which ``nn.CrossEntropyLoss`` would take for class probabilities."""
    return F.cross_entropy(output, label.long())


def fit_horovod(df: Any, args: argparse.Namespace, store_dir: str, run: int) -> dict[str, float]:
    """Horovod's ``TorchEstimator`` on ``df`` (in the peer venv): the total fit time."""
    from horovod.spark.common.store import LocalStore
    from horovod.spark.torch import TorchEstimator

    model = make_model(args.features, CLASSES)
    estimator = TorchEstimator(
        num_proc=2,
        store=LocalStore(os.path.join(store_dir, f"horovod-{run}")),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=args.lr),
        loss=horovod_loss,
        feature_cols=["features"],
        # Horovod's torch estimator needs each feature column's shape (its docs' usage).
        input_shapes=[[-1, args.features]],
        label_cols=["label"],
        batch_size=args.batch_size,
        epochs=args.epochs,
        verbose=0,
        random_seed=0,
        use_gpu=False,
    )
    start = time.time()
    estimator.fit(df)
    return {"total_s": time.time() - start}


def horovod_main(args: argparse.Namespace) -> None:
    """This script's Horovod run (``--horovod-peer``, in the peer venv): the same DataFrame in
    its own Spark session, Horovod's fit ``--rounds`` times; hands back each fit's figures."""
    spark = spark_session()
    df = make_frame(spark, args.rows, args.features, seed=1)
    df.count()
    with tempfile.TemporaryDirectory(prefix="kolo-bench-spark-horovod-") as store_dir:
        fits = [fit_horovod(df, args, store_dir, run) for run in range(args.rounds)]
    import pyspark

    horovod_peer.emit_result({"fits": fits, "pyspark": pyspark.__version__})
    spark.stop()


def horovod_fit_args(args: argparse.Namespace) -> list[str]:
    """The Horovod run's arguments: one fit with this run's data, model and training knobs."""
    return [
        *("--rows", str(args.rows), "--features", str(args.features)),
        *("--epochs", str(args.epochs), "--batch-size", str(args.batch_size)),
        *("--lr", str(args.lr), "--rounds", "1"),
    ]


def horovod_requirements(python: Path) -> Optional[str]:
    """Why Horovod's Spark estimator cannot run in the peer venv (None: it can)."""
    probe = subprocess.run(
        [str(python), "-c", "import horovod.spark.torch, petastorm, pyarrow, pyspark"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode == 0:
        return None
    return (
        probe.stderr.strip().splitlines()[-1]
        + " (bench/peers/horovod.sh --spark installs Horovod's Spark requirements)"
    )


def fit_distributor(df: Any, args: argparse.Namespace, store_dir: str, run: int) -> dict:
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.torch.distributor import TorchDistributor

    path = os.path.join(store_dir, f"distributor-{run}")
    model = make_model(args.features, CLASSES)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    start = time.time()
    (
        df.select(vector_to_array("features", "float32").alias("features"), "label")
        .repartition(2)
        .write.parquet(path)
    )
    prepared = time.time()
    distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    state, first_step = distributor.run(
        ddp_train, path, buffer.getvalue(), args.epochs, args.batch_size, args.lr
    )
    total = time.time() - start
    model.load_state_dict(state)
    return {
        "total_s": total,
        "prepare_s": prepared - start,
        "first_step_s": first_step - start,
        "launch_to_first_step_s": first_step - prepared,
    }


def ddp_train(parquet_dir: str, model_bytes: bytes, epochs: int, batch_size: int, lr: float):
    """One TorchDistributor rank: gloo DDP over this rank's share of the Parquet files, read
    with pyarrow, shuffled per epoch; returns (state_dict on rank 0, first-step wall time)."""
    import glob
    import io
    import os

    import pyarrow.parquet as pq
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr * size)
    files = sorted(glob.glob(os.path.join(parquet_dir, "*.parquet")))
    table = pq.read_table(files[rank::size], columns=["features", "label"])
    column = table.column("features").combine_chunks()
    width = len(column[0])
    features = column.flatten().to_numpy().astype(np.float32).reshape(-1, width)
    labels = table.column("label").to_numpy().astype(np.int64)
    # equal steps on every rank, as DDP needs
    steps = torch.tensor([len(labels) // batch_size])
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    first_step = None
    for epoch in range(epochs):
        order = np.random.default_rng(epoch).permutation(len(labels))
        for step in range(int(steps)):
            rows = order[step * batch_size : (step + 1) * batch_size]
            x = torch.from_numpy(features[rows])
            y = torch.from_numpy(labels[rows])
            optimizer.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            optimizer.step()
            if first_step is None:
                first_step = time.time()
    dist.destroy_process_group()
    if rank != 0:
        return None
    return {key: value.clone() for key, value in model.state_dict().items()}, first_step


def run_horovod_fit(python: Path) -> Callable[..., dict[str, Any]]:
    """A fit of the round order that runs Horovod's (:func:`horovod_main`, one fit)."""

    def fit(df: Any, args: argparse.Namespace, store_dir: str, run: int) -> dict[str, Any]:
        try:
            result = horovod_peer.run_horovod(
                python, Path(__file__).resolve(), horovod_fit_args(args), timeout=1800
            )
        except horovod_peer.HorovodPeerFailed as failed:
            return {"error": str(failed)}
        return {**result["fits"][0], "pyspark": result["pyspark"]}

    return fit


def horovod_summary(
    kolo: dict[str, float], runs: list[dict], versions: Optional[dict[str, str]]
) -> dict[str, Any]:
    """Prints Horovod's fit time beside kolo's and returns its figures for the JSON."""
    fits = [run for run in runs if "error" not in run]
    figures: dict[str, Any] = {
        "versions": versions,
        "runs": runs,
        "failed_runs": len(runs) - len(fits),
    }
    if not fits:
        print(f"total fit: Horovod TorchEstimator: no figures ({len(runs)} runs failed)")
        return figures
    import pyspark

    total = statistics.median(run["total_s"] for run in fits)
    figures.update(total_s=total, ratio_horovod_over_kolo=total / kolo["total_s"])
    print(
        f"total fit: kolo {kolo['total_s']:.2f} s vs Horovod {versions and versions['horovod']} "
        f"TorchEstimator {total:.2f} s -> ratio Horovod/kolo {total / kolo['total_s']:.2f} "
        f"(Horovod on torch {versions and versions['torch']}, pyspark {fits[0]['pyspark']}; "
        f"kolo on torch {torch.__version__}, pyspark {pyspark.__version__})"
    )
    return figures


def time_transform(run: Callable[[], Any]) -> float:
    """Seconds to evaluate a DataFrame fully (Spark's ``noop`` sink)."""
    start = time.perf_counter()
    run().write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def as_arrays(df: Any) -> Any:
    """``df`` with its ``features`` vector as ``array<float>`` (pandas cannot take vectors)."""
    from pyspark.ml.functions import vector_to_array

    return df.withColumn("features", vector_to_array("features", "float32"))


def with_prediction(schema: Any) -> Any:
    """``schema`` plus a ``prediction: array<double>`` column (a new StructType)."""
    from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

    return StructType([*schema.fields, StructField("prediction", ArrayType(DoubleType()))])


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    if args.horovod_peer:
        horovod_main(args)
        return
    horovod_python = horovod_peer.peer_python(args.horovod, "spark_estimator")
    horovod_versions: Optional[dict[str, str]] = None
    if horovod_python is not None:
        why_not = horovod_requirements(horovod_python)
        if why_not is not None:
            print(f"spark_estimator: Horovod's TorchEstimator skipped: {why_not}", flush=True)
            if args.horovod == "yes":
                sys.exit(1)
            horovod_python = None
        else:
            horovod_versions = horovod_peer.versions(horovod_python)
    spark = spark_session()
    df = make_frame(spark, args.rows, args.features, seed=1)
    df.count()
    test_rows = args.transform_rows
    test_df = make_frame(spark, test_rows, args.features, seed=2)
    test_df.count()
    kolo_runs: list[dict] = []
    peer_runs: list[dict] = []
    horovod_runs: list[dict] = []
    fitted = None
    with tempfile.TemporaryDirectory(prefix="kolo-bench-spark-") as store_dir:
        for round_ in range(args.rounds):
            order = [("kolo", fit_kolo), ("peer", fit_distributor)]
            if horovod_python is not None:
                order.append(("horovod", run_horovod_fit(horovod_python)))
            for name, fit in order if round_ % 2 == 0 else order[::-1]:
                figures = fit(df, args, store_dir, round_)
                if name == "kolo":
                    fitted = figures.pop("_model")
                    kolo_runs.append(figures)
                elif name == "horovod":
                    horovod_runs.append(figures)
                    if "error" in figures:
                        print(f"round {round_} horovod: failed: {figures['error']}", flush=True)
                        continue
                else:
                    peer_runs.append(figures)
                shown = ", ".join(
                    f"{k}={v:.2f}"
                    for k, v in sorted(figures.items())
                    if isinstance(v, float) and not k.startswith("launch.")
                )
                print(f"round {round_} {name}: {shown}", flush=True)
        assert fitted is not None
        torch_model = fitted.getModel()
        inference: dict[str, list[float]] = {"kolo": [], "row_by_row": [], "map_in_pandas": []}
        out_schema = with_prediction(test_df.schema)
        test_arrays = as_arrays(test_df)
        runners = {
            "kolo": lambda: fitted.transform(test_df),
            "row_by_row": lambda: spark.createDataFrame(
                test_df.rdd.mapPartitions(row_by_row(torch_model, "features")), out_schema
            ),
            "map_in_pandas": lambda: test_arrays.mapInPandas(
                batched_pandas(torch_model, "features"), with_prediction(test_arrays.schema)
            ),
        }
        for run in runners.values():  # warm-up: Python workers, torch import, model load
            time_transform(run)
        for round_ in range(args.rounds):
            names = list(runners) if round_ % 2 == 0 else list(runners)[::-1]
            for name in names:
                inference[name].append(test_rows / time_transform(runners[name]))

    kolo = {k: statistics.median(r[k] for r in kolo_runs) for k in kolo_runs[0]}
    peer = {k: statistics.median(r[k] for r in peer_runs) for k in peer_runs[0]}
    rows_per_s = {name: statistics.median(values) for name, values in inference.items()}
    ratio_launch = kolo["launch_s"] / peer["launch_to_first_step_s"]
    print(
        f"launch to first step: kolo {kolo['launch_s']:.2f} s vs TorchDistributor "
        f"{peer['launch_to_first_step_s']:.2f} s -> ratio {ratio_launch:.2f} "
        f"(target <= 0.5, and <= 5 s)"
    )
    print(
        f"fit call to first step: kolo {kolo['first_step_s']:.2f} s vs TorchDistributor "
        f"{peer['first_step_s']:.2f} s -> ratio {kolo['first_step_s'] / peer['first_step_s']:.2f}"
    )
    print(
        f"total fit: kolo {kolo['total_s']:.2f} s vs TorchDistributor {peer['total_s']:.2f} s "
        f"-> ratio {kolo['total_s'] / peer['total_s']:.2f}"
    )
    horovod_fit = None
    if horovod_python is not None:
        horovod_fit = horovod_summary(kolo, horovod_runs, horovod_versions)
    parts = ", ".join(
        f"{k[:-2]} {v:.2f} s"
        for k, v in kolo.items()
        if k != "total_s" and not k.startswith("launch.")
    )
    print(f"kolo fit parts: {parts}")
    launch_parts = ", ".join(
        f"{k[len('launch.') : -2]} {v:.3f}" for k, v in kolo.items() if k.startswith("launch.")
    )
    if launch_parts:
        print(f"kolo launch to first step, breakdown (s): {launch_parts}")
    for peer_name, target in (("row_by_row", 20.0), ("map_in_pandas", 1.0)):
        ratio = rows_per_s["kolo"] / rows_per_s[peer_name]
        print(
            f"transform rows/s: kolo {rows_per_s['kolo']:.0f} vs {peer_name} "
            f"{rows_per_s[peer_name]:.0f} -> ratio {ratio:.2f} (target >= {target:g})"
        )
    write_results(
        "spark_estimator",
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "kolo_fit": kolo,
            "distributor_fit": peer,
            "kolo_fit_runs": kolo_runs,
            "distributor_fit_runs": peer_runs,
            "horovod_fit": horovod_fit,
            "transform_rows_per_s": rows_per_s,
            "transform_runs": inference,
        },
        args.json,
    )
    spark.stop()


if __name__ == "__main__":
    main()
