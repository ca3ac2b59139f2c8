"""Parquet -> torch loader throughput: kolo's ParquetLoader vs pyarrow, Ray Data, Petastorm.

    python bench/loader.py [--rows 2621440] [--batch-sizes 32,256,4096]
        [--variants uncompressed,snappy,array] [--peers kolo,pyarrow,ray,petastorm]
        [--epochs 2] [--repeats 2] [--seconds 10] [--max-batches N] [--petastorm-python PATH]

The dataset (about 1 GB: 100 float32 columns + int64 label, 8 files, 163,840-row row groups of
about 64 MiB; see loader_data.py) is generated once into ``--data-dir`` and its files are read
once before timing, so the page cache is warm and the runs measure the loaders, not the disk.
Every (loader, batch size, variant) runs in a fresh process (loader_peers.py) that iterates
``--epochs`` shuffled epochs, stopping early ``--seconds`` after its first batch or after
``--max-batches``, and reports rows, time to first batch (from building the loader; imports and
``ray.init`` are not included, ray.init is reported on its own), CPU seconds and peak memory of
its process tree. The loaders take turns (kolo, peer, kolo, peer, ...) for ``--repeats`` rounds
and the median run is kept (with two rounds, the slower one).

One line per (variant, batch size) gives each loader's first epoch after its first batch:
throughput, CPU seconds per GB (the JSON also has them with start-up), time to first batch,
peak RSS (VmHWM, mapped file pages included), "anon" (the sampled peak of anonymous memory; for
Ray, the peak summed PSS of the driver and its Ray processes), and kolo's ratio to each peer. A
second line gives the later epochs (which find threads, buffers and file mappings set up, as
every epoch of a training job but the first does) of the loaders that got past their first
epoch within ``--seconds``. GB/s counts the logical bytes of the selected columns (408 B per
row). kolo's GB/s at the largest batch on uncompressed data is also given as a share of a
single-threaded memcpy, for the first epoch and the later ones (the memcpy is timed on buffers
written once before, without first-touch page faults, as in the later epochs, and after the
loaders ran: its GiB buffers, allocated and freed just before a loader, slowed it), and as a
share of the machine's ceiling for such a loader (``Floor``): every byte copied once (a shuffle
must) at the one-thread memcpy rate per core and at most the all-cores memcpy rate, plus the
caller's hand-off of each batch to per-column tensors (``from_numpy`` + ``unbind``, timed
here), on the cores available; with kolo's CPU seconds per GB beside the floor's (steadier than
GB/s on a loaded machine), the bytes it wrote per byte delivered, and its CPU seconds per GB by
thread
(``kolo-gather``, ``kolo-decode``, ``kolo-assemble``, ``python`` = the caller's thread).
JSON goes to bench/results/loader-<time>.json (or ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from loader_data import (
    VARIANTS,
    DatasetSpec,
    ensure_dataset,
    handoff_seconds_per_batch,
    memcpy_bound_gbps,
    parquet_files,
    warm_page_cache,
)
from loader_peers import tree_pids

HERE = Path(__file__).resolve().parent
CHILD = HERE / "loader_peers.py"
ALL_LOADERS = ("kolo", "pyarrow", "ray", "petastorm")
DEFAULT_PETASTORM_PYTHON = Path.home() / ".cache/kolo-bench/petastorm-venv/bin/python"
IMPORT_CHECKS = {
    "kolo": "from kolo.data import ParquetLoader",
    "pyarrow": "import pyarrow.parquet, torch",
    "ray": "import ray.data, torch",
    "petastorm": "from petastorm import make_batch_reader; from petastorm.pytorch import "
    "BatchedDataLoader; import torch",
}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    def csv(text: str) -> list[str]:
        return [x.strip() for x in text.split(",") if x.strip()]

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, default=Path.home() / ".cache/kolo-bench/loader")
    parser.add_argument("--rows", type=int, default=2_621_440)
    parser.add_argument("--columns", type=int, default=100, help="float32 columns (array length)")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--row-group-rows", type=int, default=163_840)
    parser.add_argument("--variants", type=csv, default=list(VARIANTS))
    parser.add_argument(
        "--batch-sizes", type=lambda t: [int(x) for x in csv(t)], default=[32, 256, 4096]
    )
    parser.add_argument(
        "--peers", type=csv, default=list(ALL_LOADERS), help="loaders to run, kolo included"
    )
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run (>= 1)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="stop a run this long after its first batch"
    )
    parser.add_argument("--max-batches", type=int, default=1 << 40)
    parser.add_argument("--shuffle-buffer", type=int, default=16_384, help="rows, every loader")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memcpy-bytes", type=int, default=1 << 30)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run, then killed")
    parser.add_argument("--petastorm-python", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="results file")
    args = parser.parse_args(argv)
    unknown = set(args.peers) - set(ALL_LOADERS) or set(args.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown loader or variant {sorted(unknown)}")
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    return args


@dataclass(frozen=True)
class Floor:
    """The machine's ceiling for a loader that shuffles rows (so copies each byte at least
    once) and hands out one torch tensor per column: the copy runs at the one-thread memcpy
    rate per core, at most at the all-cores memcpy rate together, and the caller's thread
    turns each batch into tensors (``handoff_s``, at least). With ``cores`` cores shared by
    both, the loader can deliver at most ``min(parallel, cores / (1 / memcpy + hand-off per
    GB), 1 / hand-off per GB)`` GB/s."""

    memcpy_GBps: float
    parallel_GBps: float
    handoff_s: float
    cores: int

    @classmethod
    def measure(cls, memcpy: float, nbytes: int, columns: int, batch_size: int) -> Floor:
        from calibrate import concurrent_copy_seconds

        cores = len(os.sched_getaffinity(0))
        each = max(nbytes // cores, 1 << 20)
        parallel = cores * each / concurrent_copy_seconds(each, cores, 1.0) / 1e9
        return cls(memcpy, parallel, handoff_seconds_per_batch(columns, batch_size), cores)

    def gbps(self, batch_bytes: int) -> dict[str, float]:
        handoff_per_gb = self.handoff_s / (batch_bytes / 1e9)
        bounds = {
            "memory_GBps": self.parallel_GBps,
            "cpu_GBps": self.cores / (1 / self.memcpy_GBps + handoff_per_gb),
            "handoff_GBps": 1 / handoff_per_gb,
        }
        return {"GBps": min(bounds.values()), **bounds}

    def describe(self, kolo: dict[str, Any], batch_size: int, row_bytes: int) -> dict[str, Any]:
        out: dict[str, Any] = self.gbps(batch_size * row_bytes)
        text = (
            f"{out['GBps']:.2f} GB/s = min({self.cores}-thread memcpy "
            f"{out['memory_GBps']:.2f}, {self.cores} cores / (one copy at {self.memcpy_GBps:.2f} "
            f"GB/s + hand-off {self.handoff_s * 1e6:.0f} us/batch) {out['cpu_GBps']:.2f}, "
            f"hand-off alone {out['handoff_GBps']:.2f})"
        )
        shares = [("first", "GBps", "first epoch"), ("later", "later_GBps", "later epochs")]
        parts = []
        for key, field, label in shares:
            if field in kolo:
                out[f"kolo_{key}_share"] = kolo[field] / out["GBps"]
                parts.append(f"{out[f'kolo_{key}_share']:.0%} ({label})")
        if parts:
            text += "; kolo " + ", ".join(parts) + " of it"
        # CPU seconds per GB change less with the machine's load than GB/s do.
        floor_cpu = 1 / self.memcpy_GBps + self.handoff_s / (batch_size * row_bytes / 1e9)
        out["floor_cpu_s_per_GB"] = floor_cpu
        cpu = [f"{kolo[k]:.3f}" for k in ("cpu_s_per_GB", "later_cpu_s_per_GB") if k in kolo]
        text += f"; CPU-s/GB: floor {floor_cpu:.3f}, kolo {' / '.join(cpu)}"
        if kolo.get("bytes_copied") and kolo.get("rows_total"):
            out["kolo_bytes_written_per_byte"] = kolo["bytes_copied"] / (
                kolo["rows_total"] * row_bytes
            )
            text += (
                f"; kolo wrote {out['kolo_bytes_written_per_byte']:.2f} B per B delivered "
                "(prefetched batches included)"
            )
        out["text"] = text
        return out


def interpreter(loader: str, args: argparse.Namespace) -> str:
    if loader == "petastorm":
        if args.petastorm_python:
            return str(args.petastorm_python)
        if DEFAULT_PETASTORM_PYTHON.exists():
            return str(DEFAULT_PETASTORM_PYTHON)
    return sys.executable


def unavailable_reason(loader: str, python: str) -> Optional[str]:
    """None when ``loader`` imports in ``python``, else the error's last line."""
    probe = subprocess.run(
        [python, "-c", IMPORT_CHECKS[loader]], capture_output=True, text=True, timeout=120
    )
    if probe.returncode == 0:
        return None
    lines = (probe.stderr or probe.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {probe.returncode}"


def adopt_orphans() -> None:
    """Makes this process the reaper of its descendants' orphans (Linux), so that what a run
    leaves behind (Ray's daemons, some in sessions of their own) can be found and ended."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def end_leftovers(timeout: float = 20.0) -> None:
    """Kills what a run left running (Ray's daemons outlive its driver by seconds, busy) and
    waits until it is gone, so the next run has the machine to itself."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = tree_pids(os.getpid())[1:]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        if not pids:
            return
        time.sleep(0.1)


def run_child(python: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0")
    proc = subprocess.Popen(
        [python, str(CHILD), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"loader": spec["loader"], "error": f"timed out after {timeout:g} s"}
    finally:
        end_leftovers()
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (stderr or stdout).strip().splitlines()
    return {"loader": spec["loader"], "error": tail[-1] if tail else f"exit {proc.returncode}"}


def figures(run: dict[str, Any], row_bytes: int) -> dict[str, Any]:
    """Rates from one run's raw counts."""
    steady = max(run["steady_seconds"], 1e-9)
    rows_per_s = run["steady_rows"] / steady if run["steady_rows"] else run["rows"] / run["seconds"]
    steady_gb = run["steady_rows"] * row_bytes / 1e9
    gb = run["rows"] * row_bytes / 1e9
    out = {
        **run,
        "rows_per_s": rows_per_s,
        "GBps": rows_per_s * row_bytes / 1e9,
        "cpu_s_per_GB": run["steady_cpu_s"] / steady_gb if steady_gb else run["cpu_s"] / gb,
        "cpu_s_per_GB_with_startup": run["cpu_s"] / gb,
    }
    by_thread = run.get("steady_cpu_s_by_thread", {})
    if steady_gb:
        out["cpu_s_per_GB_by_thread"] = {k: v / steady_gb for k, v in by_thread.items() if v}
    if run.get("later_rows"):
        later_gb = run["later_rows"] * row_bytes / 1e9
        out["later_cpu_s_per_GB_by_thread"] = {
            k: v / later_gb for k, v in run.get("later_cpu_s_by_thread", {}).items() if v
        }
        out["later_rows_per_s"] = run["later_rows"] / max(run["later_seconds"], 1e-9)
        out["later_GBps"] = out["later_rows_per_s"] * row_bytes / 1e9
        out["later_cpu_s_per_GB"] = run["later_cpu_s"] / later_gb
    return out


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = sorted((r for r in runs if "error" not in r), key=lambda r: r["rows_per_s"])
    if not good:
        return runs[-1]
    chosen = dict(good[(len(good) - 1) // 2])
    chosen["rows_per_s_runs"] = [r["rows_per_s"] for r in good]
    chosen["rows_per_s_median"] = statistics.median(chosen["rows_per_s_runs"])
    # The later epochs' figures: the median run by their own rate (the slower of two).
    later = sorted(
        (r for r in good if "later_rows_per_s" in r), key=lambda r: r["later_rows_per_s"]
    )
    for key in (
        "later_rows_per_s",
        "later_GBps",
        "later_cpu_s_per_GB",
        "later_cpu_s_per_GB_by_thread",
    ):
        chosen.pop(key, None)
        if later:
            chosen[key] = later[(len(later) - 1) // 2][key]
    chosen["later_rows_per_s_runs"] = [r["later_rows_per_s"] for r in later]
    return chosen


def describe(result: dict[str, Any]) -> str:
    name = result["loader"]
    if "unavailable" in result:
        return f"{name} unavailable ({result['unavailable']})"
    if "error" in result:
        return f"{name} failed ({result['error']})"
    extra = f", ray.init {result['ray_init_s']:.1f} s" if "ray_init_s" in result else ""
    return (
        f"{name} {result['rows_per_s'] / 1e6:.3f}M rows/s ({result['GBps']:.2f} GB/s, "
        f"{result['cpu_s_per_GB']:.2f} CPU-s/GB, first batch {result['first_batch_s']:.2f} s, "
        f"peak RSS {result['peak_rss_bytes'] / 1e6:.0f} MB, "
        f"anon {result['peak_rss_anon_bytes'] / 1e6:.0f} MB{extra})"
    )


def describe_later(result: dict[str, Any]) -> Optional[str]:
    if "later_rows_per_s" not in result:
        return None
    return (
        f"{result['loader']} {result['later_rows_per_s'] / 1e6:.3f}M rows/s "
        f"({result['later_GBps']:.2f} GB/s, {result['later_cpu_s_per_GB']:.2f} CPU-s/GB)"
    )


def thread_text(result: dict[str, Any]) -> str:
    """A run's CPU seconds per GB by thread name, first epoch | later epochs."""
    first = result.get("cpu_s_per_GB_by_thread", {})
    later = result.get("later_cpu_s_per_GB_by_thread", {})
    names = sorted(set(first) | set(later), key=lambda n: -first.get(n, later.get(n, 0.0)))
    cell = lambda table, name: f"{table[name]:.3f}" if name in table else "-"  # noqa: E731
    return ", ".join(f"{name} {cell(first, name)} | {cell(later, name)}" for name in names)


def ratios(row: dict[str, dict[str, Any]], key: str = "rows_per_s") -> dict[str, float]:
    kolo = row.get("kolo", {})
    if key not in kolo:
        return {}
    return {
        peer: kolo[key] / result[key]
        for peer, result in row.items()
        if peer != "kolo" and result.get(key)
    }


def ratio_text(row_ratios: dict[str, float]) -> str:
    return ", ".join(f"kolo/{p} {r:.2f}x" for p, r in row_ratios.items())


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    adopt_orphans()
    loaders = [name for name in ALL_LOADERS if name in args.peers]
    pythons = {name: interpreter(name, args) for name in loaders}
    unavailable = {name: unavailable_reason(name, pythons[name]) for name in loaders}
    for name, reason in unavailable.items():
        if reason:
            print(f"loader {name}: unavailable ({reason})", flush=True)

    datasets = {}
    for variant in args.variants:
        spec = DatasetSpec(variant, args.rows, args.columns, args.files, args.row_group_rows)
        started = time.perf_counter()
        folder = ensure_dataset(args.data_dir, spec)
        files = parquet_files(folder)
        file_bytes = warm_page_cache(files)
        datasets[variant] = (spec, folder, files)
        print(
            f"dataset {variant}: {spec.rows} rows x {spec.row_bytes} B = "
            f"{spec.rows * spec.row_bytes / 1e9:.2f} GB logical, {file_bytes / 1e9:.2f} GB in "
            f"{len(files)} files ({spec.compression}), page cache warmed "
            f"({time.perf_counter() - started:.1f} s)",
            flush=True,
        )
    load_before = os.getloadavg()
    results = []
    # (entry, kolo's figures, row bytes) of the rows that get the memcpy share and ceiling
    shared: list[tuple[dict[str, Any], dict[str, Any], int]] = []
    for variant, (spec, folder, files) in datasets.items():
        for batch_size in args.batch_sizes:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in loaders}
            for _ in range(args.repeats):
                for name in loaders:
                    if unavailable[name]:
                        continue
                    child_spec = {
                        "loader": name,
                        "folder": str(folder),
                        "files": [str(f) for f in files],
                        "columns": spec.column_names,
                        "batch_size": batch_size,
                        "shuffle_buffer": args.shuffle_buffer,
                        "seed": args.seed,
                        "seconds": args.seconds,
                        "max_batches": args.max_batches,
                        "epochs": args.epochs,
                        "epoch_rows": spec.rows // batch_size * batch_size,
                    }
                    run = run_child(pythons[name], child_spec, args.timeout)
                    runs[name].append(figures(run, spec.row_bytes) if "error" not in run else run)
            row = {
                name: {"loader": name, "unavailable": unavailable[name]}
                if unavailable[name]
                else median_run(runs[name])
                for name in loaders
            }
            row_ratios = ratios(row)
            line = " | ".join(describe(row[name]) for name in loaders)
            if row_ratios:
                line += " | " + ratio_text(row_ratios)
            print(f"loader {variant} b={batch_size}: {line}", flush=True)
            later_ratios = ratios(row, "later_rows_per_s")
            later = [text for name in loaders if (text := describe_later(row[name]))]
            if later:
                line = " | ".join(later + ([ratio_text(later_ratios)] if later_ratios else []))
                print(f"later epochs {variant} b={batch_size}: {line}", flush=True)
            entry = {
                "variant": variant,
                "batch_size": batch_size,
                "loaders": row,
                "ratios_rows_per_s": row_ratios,
                "ratios_later_rows_per_s": later_ratios,
            }
            kolo = row.get("kolo", {})
            if variant == "uncompressed" and batch_size == max(args.batch_sizes) and "GBps" in kolo:
                shared.append((entry, kolo, spec.row_bytes))
            results.append(entry)

    # The memcpy is timed after the loaders ran: allocating and freeing its GiB buffers just
    # before a loader's process cut that loader's later epochs by up to a quarter (7.5-9.8
    # GB/s against 10.0-10.1, 3 interleaved pairs, this VM).
    memcpy = memcpy_bound_gbps(args.memcpy_bytes)
    print(f"memcpy bound: {memcpy:.2f} GB/s (np.copyto of {args.memcpy_bytes >> 20} MiB, 1 thread)")
    floor = Floor.measure(memcpy, args.memcpy_bytes, args.columns, max(args.batch_sizes))
    print(
        f"{floor.cores} cores: memcpy {floor.parallel_GBps:.2f} GB/s on {floor.cores} threads at "
        f"once; tensor hand-off {floor.handoff_s * 1e6:.0f} us per batch of "
        f"{max(args.batch_sizes)} (from_numpy + unbind of {args.columns} columns + label)",
        flush=True,
    )
    for entry, kolo, row_bytes in shared:
        where = f"{entry['variant']} b={entry['batch_size']}"
        share = kolo["GBps"] / memcpy
        entry["kolo_share_of_memcpy"] = share
        text = f"kolo {kolo['GBps']:.2f} GB/s = {share:.0%} (first epoch)"
        if "later_GBps" in kolo:
            entry["kolo_later_share_of_memcpy"] = kolo["later_GBps"] / memcpy
            later = kolo["later_GBps"]
            text += f", {later:.2f} GB/s = {later / memcpy:.0%} (later epochs)"
        print(f"memcpy share {where}: {text} of the memcpy bound ({memcpy:.2f} GB/s)", flush=True)
        entry["ceiling"] = floor.describe(kolo, entry["batch_size"], row_bytes)
        print(f"ceiling {where}: {entry['ceiling']['text']}", flush=True)
        print(
            f"kolo CPU-s/GB by thread {where} (first epoch | later epochs; a memcpy costs "
            f"{1 / memcpy:.3f}): {thread_text(kolo)}",
            flush=True,
        )

    from common import write_results

    write_results(
        "loader",
        {
            "dataset": {
                variant: {
                    "rows": spec.rows,
                    "row_bytes": spec.row_bytes,
                    "files": len(files),
                    "row_group_rows": spec.row_group_rows,
                    "compression": spec.compression,
                    "file_bytes": sum(f.stat().st_size for f in files),
                    "columns": len(spec.column_names),
                }
                for variant, (spec, _, files) in datasets.items()
            },
            "settings": {
                "repeats": args.repeats,
                "epochs": args.epochs,
                "seconds_cap": args.seconds,
                "max_batches": args.max_batches,
                "shuffle_buffer_rows": args.shuffle_buffer,
                "page_cache": "warm",
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(),
                "interpreters": pythons,
            },
            "memcpy_GBps": memcpy,
            "floor": {
                "cores": floor.cores,
                "parallel_memcpy_GBps": floor.parallel_GBps,
                "handoff_s_per_batch": floor.handoff_s,
            },
            "unavailable": {k: v for k, v in unavailable.items() if v},
            "results": results,
        },
        out=args.json,
    )


if __name__ == "__main__":
    main()
