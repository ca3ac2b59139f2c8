"""The loader benchmark's dataset: deterministic Parquet files, generated once and cached.

Three variants of the same rows: ``uncompressed`` and ``snappy`` (``f000`` .. ``f099`` float32
columns plus an int64 ``label``) and ``array`` (one ``features`` list<float32> column of fixed
length 100, the way Spark writes ``array<float>``, plus ``label``; uncompressed). Columns are
PLAIN encoded (no dictionary); values are standard-normal floats and labels in 0..9, drawn from
a seeded generator, so every run reads the same bytes. A variant's folder holds ``_spec.json``;
a folder whose spec matches is reused, anything else is regenerated.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

VARIANTS = ("uncompressed", "snappy", "array")
SPEC_VERSION = 1


@dataclass(frozen=True)
class DatasetSpec:
    """What one variant's files hold; equal specs mean equal bytes."""

    variant: str
    rows: int
    columns: int
    files: int
    row_group_rows: int
    seed: int = 0
    version: int = SPEC_VERSION

    @property
    def compression(self) -> str:
        return "snappy" if self.variant == "snappy" else "none"

    @property
    def column_names(self) -> list[str]:
        """The columns a loader selects, label last."""
        if self.variant == "array":
            return ["features", "label"]
        return [f"f{i:03d}" for i in range(self.columns)] + ["label"]

    @property
    def row_bytes(self) -> int:
        """Logical bytes of one row of the selected columns (float32 values + int64 label)."""
        return self.columns * 4 + 8


def _file_table(spec: DatasetSpec, index: int, rows: int) -> pa.Table:
    rng = np.random.default_rng([spec.seed, index])
    values = rng.standard_normal((rows, spec.columns), dtype=np.float32)
    label = pa.array(rng.integers(0, 10, rows, dtype=np.int64))
    if spec.variant == "array":
        offsets = pa.array(np.arange(0, rows * spec.columns + 1, spec.columns, dtype=np.int32))
        features = pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1)))
        return pa.table({"features": features, "label": label})
    names = spec.column_names
    arrays = [pa.array(np.ascontiguousarray(values[:, i])) for i in range(spec.columns)]
    return pa.table(dict(zip(names, [*arrays, label])))


def ensure_dataset(root: Path, spec: DatasetSpec) -> Path:
    """Returns ``root/<variant>`` holding the files ``spec`` describes, writing them if needed."""
    folder = root / spec.variant
    spec_file = folder / "_spec.json"  # "_" names are not data to Spark-style readers
    if spec_file.exists() and json.loads(spec_file.read_text()) == asdict(spec):
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    per_file = -(-spec.rows // spec.files)
    start = 0
    for index in range(spec.files):
        rows = min(per_file, spec.rows - start)
        if rows <= 0:
            break
        pq.write_table(
            _file_table(spec, index, rows),
            folder / f"part-{index:05d}.parquet",
            row_group_size=spec.row_group_rows,
            compression=spec.compression,
            use_dictionary=False,
        )
        start += rows
    spec_file.write_text(json.dumps(asdict(spec), indent=2))
    return folder


def parquet_files(folder: Path) -> list[Path]:
    """The variant's Parquet files in name order."""
    return sorted(folder.glob("*.parquet"))


def warm_page_cache(files: list[Path]) -> int:
    """Reads every file once so runs measure the loader rather than the disk; returns bytes."""
    total = 0
    for path in files:
        with open(path, "rb") as handle:
            while chunk := handle.read(16 << 20):
                total += len(chunk)
    return total


def handoff_seconds_per_batch(columns: int, batch_size: int, calls: int = 2000) -> float:
    """The least a loader that hands out one torch tensor per scalar column must spend on its
    caller's thread per batch once the values lie in memory: ``torch.from_numpy`` of a
    ``[columns, batch]`` float32 buffer split by ``unbind`` (a view per column; cheaper than a
    ``from_numpy`` each) plus the int64 label, into a dict. Median of 5 rounds of ``calls``."""
    import time

    import torch

    values = np.zeros((columns, batch_size), np.float32)
    label = np.zeros(batch_size, np.int64)
    names = [f"f{i:03d}" for i in range(columns)]

    def handoff() -> dict:
        batch = dict(zip(names, torch.from_numpy(values).unbind(0)))
        batch["label"] = torch.from_numpy(label)
        return batch

    handoff()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            handoff()
        rounds.append((time.perf_counter() - start) / calls)
    return sorted(rounds)[len(rounds) // 2]


def memcpy_bound_gbps(nbytes: int, repeats: int = 3) -> float:
    """GB/s of one single-threaded ``np.copyto`` of ``nbytes`` (best of ``repeats``)."""
    import time

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9
