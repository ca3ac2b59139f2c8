"""Spark Connect fit overhead: kolo's TorchEstimator from a Spark Connect client vs the same fit
on a classic Spark session, same data, interleaved.

    python bench/spark_connect_estimator.py [--rows 20000] [--features 32] [--epochs 1]
                                            [--rounds 2] [--fits 2]

The data (``features`` array<float>, ``label`` double) is written once as Parquet with pyarrow;
each side reads it with ``spark.read.parquet``. The Connect side talks to one Spark Connect
server started here (PySpark's ``SparkConnectServer``, ``local[2]``, bound to 127.0.0.1, the
same Spark settings as the classic ``local[2]`` session). Each round starts one client process
per side (classic: a ``local[2]`` session in the process; Connect: ``SparkSession.builder.
remote``), in alternating order; each client runs ``--fits`` fits of the same estimator
(``num_proc=2``, a new store each) and reports the fit time and its parts (prepare, launch,
train, checkpoint, model return, from ``getTimings()``). Figures: the median over rounds of
the first fit in a process (cold: Python workers and imports on the executors) and of the
later ones (warm), each side, and the ratio Connect / classic. JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

HERE = Path(__file__).resolve().parent
CLASSES = 10


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fits", type=int, default=2, help="fits per client process")
    parser.add_argument("--json", type=Path, default=None, help="results file")
    # internal: one client process
    parser.add_argument("--client", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


#: Spark settings of both sides (the classic session and the Connect server).
SPARK_CONFS = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.pyspark.python": sys.executable,
}


def write_data(path: str, rows: int, features: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, features)).astype(np.float32)
    w = np.random.default_rng(0).standard_normal((features, CLASSES)).astype(np.float32)
    y = (x @ w).argmax(axis=1).astype(np.float64)
    offsets = pa.array(np.arange(0, rows * features + 1, features, dtype=np.int32))
    table = pa.table(
        {"features": pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1))), "label": y}
    )
    os.makedirs(path, exist_ok=True)
    for part in range(2):
        pq.write_table(table.slice(part * rows // 2, rows // 2), f"{path}/part-{part}.parquet")


@contextlib.contextmanager
def connect_server() -> Iterator[str]:
    """A local Spark Connect server (127.0.0.1; the test suite's, tests/support/spark.py) for the
    duration; yields its sc:// URL."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from support.spark import start_connect_server, stop_process_group

    with tempfile.TemporaryDirectory(prefix="kolo-bench-connect-") as logs:
        url, server = start_connect_server(Path(logs))
        try:
            yield url
        finally:
            stop_process_group(server)


def client_session(target: str) -> Any:
    from pyspark.sql import SparkSession

    if target != "classic":
        return SparkSession.builder.remote(target).getOrCreate()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.master("local[2]").appName("kolo-bench-connect-classic")
    for key, value in SPARK_CONFS.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def client(args: argparse.Namespace) -> None:
    """Runs ``--fits`` fits on one side; prints ``RESULT <json list of figures>``."""
    import torch
    from spark_peers import make_model
    from torch import nn

    from kolo.spark.common.store import Store
    from kolo.spark.torch import TorchEstimator

    spark = client_session(args.client)
    df = spark.read.parquet(args.data)
    runs = []
    for fit in range(args.fits):
        model = make_model(args.features, CLASSES)
        estimator = TorchEstimator(
            num_proc=2,
            store=Store.create(os.path.join(args.store, f"fit-{fit}")),
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
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
        figures = {"total_s": time.time() - start}
        timings = fitted.getTimings()
        figures["first_step_s"] = timings["first_step"] - start
        figures.update({f"{name}_s": value for name, value in timings["parts"].items()})
        runs.append(figures)
    spark.stop()
    print("RESULT " + json.dumps(runs), flush=True)


def run_client(args: argparse.Namespace, target: str, data: str, store: str) -> list[dict]:
    command = [sys.executable, str(Path(__file__).resolve()), "--client", target]
    command += ["--data", data, "--store", store, "--fits", str(args.fits)]
    command += ["--features", str(args.features), "--epochs", str(args.epochs)]
    command += ["--batch-size", str(args.batch_size)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOLO_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"{target} client failed:\n{result.stderr[-4000:]}")
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def median_of(runs: list[dict]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    args = parse_args()
    if args.client:
        client(args)
        return
    from common import write_results

    results: dict[str, dict[str, list[dict]]] = {
        "classic": {"cold": [], "warm": []},
        "connect": {"cold": [], "warm": []},
    }
    with tempfile.TemporaryDirectory(prefix="kolo-bench-connect-") as scratch:
        data = os.path.join(scratch, "data")
        write_data(data, args.rows, args.features)
        with connect_server() as url:
            for round_ in range(args.rounds):
                sides = [("classic", "classic"), ("connect", url)]
                for name, target in sides if round_ % 2 == 0 else sides[::-1]:
                    store = os.path.join(scratch, f"{name}-{round_}")
                    runs = run_client(args, target, data, store)
                    results[name]["cold"].append(runs[0])
                    results[name]["warm"].extend(runs[1:])
                    shown = "; ".join(
                        ", ".join(f"{k[:-2]}={v:.2f}" for k, v in sorted(r.items())) for r in runs
                    )
                    print(f"round {round_} {name}: {shown}", flush=True)
    summary: dict[str, Any] = {}
    for phase in ("cold", "warm"):
        if not results["classic"][phase] or not results["connect"][phase]:
            continue
        classic, connect = (
            median_of(results["classic"][phase]),
            median_of(results["connect"][phase]),
        )
        summary[phase] = {"classic": classic, "connect": connect}
        for key in ("total_s", "prepare_s", "launch_s", "train_s", "model_return_s"):
            ratio = connect[key] / classic[key] if classic[key] > 0 else float("nan")
            print(
                f"{phase} fit {key[:-2]}: Connect {connect[key]:.2f} s vs classic "
                f"{classic[key]:.2f} s -> ratio {ratio:.2f}, overhead "
                f"{connect[key] - classic[key]:+.2f} s",
                flush=True,
            )
    write_results(
        "spark_connect_estimator",
        {"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary, "runs": results},
        args.json,
    )


if __name__ == "__main__":
    main()
