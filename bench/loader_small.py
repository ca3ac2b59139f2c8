"""Per-batch and per-epoch cost of loaders on small work (issue 24, item 6).

    python bench/loader_small.py [--rows 200000] [--columns 32] [--row-group-rows 65536]
        [--batch-sizes 256,4096] [--epochs 4] [--repeats 3] [--json PATH]

One file of ``--rows`` rows: ``--columns`` float32 feature columns and an int64 ``label``
(loader_data.py, uncompressed, PLAIN), read from the page cache. Three loaders run in this
process, taking turns (kolo, kolo-stack, rowgroup, kolo, ...) for ``--repeats`` rounds:

- ``kolo``: ``ParquetLoader`` as before, one tensor per column (``--columns + 1`` tensors).
- ``kolo-stack``: ``ParquetLoader(..., stack="features")``: one ``[batch, columns]`` feature
  tensor and the label.
- ``rowgroup``: the ten-line loader users write: read each row group (in a seeded random
  order), stack its columns, permute its rows, slice batches (the features and the label).
  It shuffles within a row group only.

Each run builds its loader and iterates ``--epochs`` epochs. Figures per run: the cold start
(building the loader to its first batch), the epoch start of the later epochs (``iter()`` to
the first batch; median), the per-batch time of the later epochs without their start
(median of the epochs' means), the CPU time of the whole process (every thread: Python's
and the loader's) per batch of the later epochs, which a loaded machine inflates less than
wall time, and rows/s over the later epochs including their start. The
median run of the rounds is printed with each kolo loader's per-batch speed relative to
the rowgroup loader (> 1: faster); JSON goes to
bench/results/loader-small-<time>.json (or ``--json``).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np
from loader_data import DatasetSpec, ensure_dataset, parquet_files, warm_page_cache

HERE = Path(__file__).resolve().parent
LOADERS = ("kolo", "kolo-stack", "rowgroup")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data-dir", type=Path, default=Path.home() / ".cache/kolo-bench/loader-small"
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--columns", type=int, default=32, help="float32 feature columns")
    parser.add_argument("--row-group-rows", type=int, default=65_536)
    parser.add_argument(
        "--batch-sizes", type=lambda t: [int(x) for x in t.split(",") if x], default=[256, 4096]
    )
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run (>= 2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--loaders",
        type=lambda t: [x for x in t.split(",") if x],
        default=list(LOADERS),
        help="loaders to run, in turn (kolo-stack needs a kolo with ParquetLoader(stack=...))",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if set(args.loaders) - set(LOADERS):
        parser.error(f"unknown loaders {sorted(set(args.loaders) - set(LOADERS))}")
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first is the cold start)")
    return args


class RowGroupLoader:
    """The ten-line loader: row groups in a random order, rows permuted within each."""

    def __init__(self, path: Path, features: list[str], label: str, batch_size: int, seed: int):
        import pyarrow.parquet as pq
        import torch

        self.file, self.torch = pq.ParquetFile(path), torch
        self.features, self.label, self.batch_size = features, label, batch_size
        self.rng = np.random.default_rng(seed)

    def __iter__(self) -> Iterator[dict]:
        from_numpy = self.torch.from_numpy
        for group in self.rng.permutation(self.file.num_row_groups):
            table = self.file.read_row_group(group, columns=[*self.features, self.label])
            x = np.stack([table[c].to_numpy() for c in self.features], axis=1)
            y = table[self.label].to_numpy()
            order = self.rng.permutation(len(y))
            for start in range(0, len(y) - self.batch_size + 1, self.batch_size):
                index = order[start : start + self.batch_size]
                yield {"features": from_numpy(x[index]), self.label: from_numpy(y[index])}


def make_loader(name: str, path: Path, spec: DatasetSpec, batch_size: int, seed: int) -> Iterable:
    columns = spec.column_names
    if name == "rowgroup":
        return RowGroupLoader(path, columns[:-1], columns[-1], batch_size, seed)
    from kolo.data import ParquetLoader

    stack = {"stack": "features"} if name == "kolo-stack" else {}
    return ParquetLoader(path, columns, batch_size, rank=0, size=1, seed=seed, to="torch", **stack)


def run(make: Callable[[], Iterable], batch_size: int, epochs: int) -> dict[str, Any]:
    """Builds a loader and iterates ``epochs`` epochs; the figures of one run."""
    begin = time.perf_counter()
    loader = make()
    starts, per_batch, rows, seconds = [], [], 0, 0.0
    cold, cpu, batches = 0.0, 0.0, 0
    for epoch in range(epochs):
        c0 = time.process_time()
        t0 = time.perf_counter()
        it = iter(loader)
        next(it)
        t1 = time.perf_counter()
        n = 1
        for _ in it:
            n += 1
        t2 = time.perf_counter()
        c2 = time.process_time()
        if epoch == 0:
            cold = t1 - begin
            continue
        starts.append(t1 - t0)
        per_batch.append((t2 - t1) / max(n - 1, 1))
        cpu += c2 - c0
        batches += n
        rows += n * batch_size
        seconds += t2 - t0
    close = getattr(loader, "close", None)
    if close is not None:
        close()
    return {
        "cold_start_ms": cold * 1e3,
        "epoch_start_ms": statistics.median(starts) * 1e3,
        "per_batch_us": statistics.median(per_batch) * 1e6,
        "cpu_per_batch_us": cpu / max(batches, 1) * 1e6,
        "rows_per_s": rows / seconds,
        "batches_per_epoch": n,
    }


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    args = parse_args(argv)
    spec = DatasetSpec("uncompressed", args.rows, args.columns, 1, args.row_group_rows)
    folder = ensure_dataset(args.data_dir, spec)
    (path,) = parquet_files(folder)
    warm_page_cache([path])
    import torch  # noqa: F401  (imports are not loader time)

    import kolo.data  # noqa: F401

    results = []
    for batch_size in args.batch_sizes:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.loaders}
        for round_ in range(args.repeats):
            for name in args.loaders:
                make = functools.partial(
                    make_loader, name, path, spec, batch_size, args.seed + round_
                )
                runs[name].append(run(make, batch_size, args.epochs))
        median = {
            name: min(rs, key=lambda r: abs(r["per_batch_us"] - _median(rs, "per_batch_us")))
            for name, rs in runs.items()
        }
        line = [f"loader-small b={batch_size} cols={args.columns}:"]
        for name in args.loaders:
            m = median[name]
            line.append(
                f"{name} {m['per_batch_us']:.1f} us/batch (CPU {m['cpu_per_batch_us']:.1f} us), "
                f"{m['rows_per_s'] / 1e6:.2f}M rows/s, "
                f"epoch start {m['epoch_start_ms']:.2f} ms, cold {m['cold_start_ms']:.1f} ms"
            )
        if "rowgroup" in median:
            # > 1: faster per batch than the ten-line loader.
            base = median["rowgroup"]["per_batch_us"]
            ratios = {n: base / median[n]["per_batch_us"] for n in median if n != "rowgroup"}
            line.append(
                "speed per batch vs rowgroup: "
                + ", ".join(f"{n} {ratio:.2f}x" for n, ratio in ratios.items())
            )
            # > 1: less CPU (all threads) per batch than the ten-line loader.
            base = median["rowgroup"]["cpu_per_batch_us"]
            line.append(
                "CPU per batch vs rowgroup: "
                + ", ".join(
                    f"{n} {base / median[n]['cpu_per_batch_us']:.2f}x"
                    for n in median
                    if n != "rowgroup"
                )
            )
        print(" | ".join(line), flush=True)
        results.append({"batch_size": batch_size, "median": median, "runs": runs})
    figures = {
        "bench": "loader-small",
        "rows": args.rows,
        "columns": args.columns,
        "row_group_rows": args.row_group_rows,
        "epochs": args.epochs,
        "repeats": args.repeats,
        "results": results,
    }
    out = args.json or HERE / "results" / f"loader-small-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    print(f"JSON: {out}")
    return figures


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
