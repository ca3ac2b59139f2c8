"""One loader run of the loader benchmark, in its own process: ``python loader_peers.py SPEC``.

SPEC is a JSON object (loader, files, folder, columns, batch_size, shuffle_buffer, seed,
seconds, max_batches, epochs, epoch_rows). The process builds the loader, iterates ``epochs``
epochs (or until ``seconds`` after the first batch, or ``max_batches``) and prints one line
``RESULT {json}`` with rows, timings, CPU seconds (user + system of the process tree, threads
included) and peak memory (VmHWM, which counts mapped file pages too, plus the sampled peak of
anonymous RSS; for Ray, whose work runs in other processes, the peak of the tree's summed PSS
sampled every 0.1 s). Rows, timings and CPU are the first epoch's (it ends once ``epoch_rows``
rows are out); ``later_*`` are those of the whole epochs after it (``*_cpu_s_by_thread``:
this process's CPU seconds by thread name, from the first batch to the first epoch's end and
over the later epochs; kolo's also ``bytes_copied``, the loader's written bytes), which find
the loader's threads, memory and file mappings already set up, as every epoch of a training
job but the first does.
It imports only the standard library at module level, so the Petastorm run can use another
interpreter (a venv with the older pyarrow Petastorm needs).

Every loader yields one dict of torch tensors per batch (scalar columns ``[B]``, the array column
``[B, 100]``), ``batch_size`` rows, shuffled through a buffer of about ``shuffle_buffer`` rows,
epochs over the same files, each in another order, last partial batch dropped (Petastorm's
BatchedDataLoader has no drop_last and its shuffling queue runs across epochs: its one short
last batch is accepted):

- ``kolo``: ``kolo.data.ParquetLoader``.
- ``pyarrow``: the hand-written loader a user would write: files in shuffled order,
  ``ParquetFile.iter_batches`` in chunks of ``shuffle_buffer`` rows into a shuffle buffer of
  numpy column arrays (permuted whenever it holds ``shuffle_buffer`` rows; the remainder carries
  over), batches gathered by fancy indexing, ``torch.from_numpy`` per column.
- ``ray``: ``ray.data.read_parquet(files, shuffle="files").select_columns(columns)
  .iter_torch_batches(batch_size, local_shuffle_buffer_size)`` after ``ray.init(num_cpus=2)``
  (ray.init timed on its own).
- ``petastorm``: ``make_batch_reader(url, num_epochs=1, workers_count=2)`` +
  ``petastorm.pytorch.BatchedDataLoader(reader, batch_size, shuffling_queue_capacity)``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from typing import Any, Iterator

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tree_pids(root: int) -> list[int]:
    """``root`` and every live descendant (from /proc/*/stat parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, []))
    return pids


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU of this process (threads and reaped children included, from rusage)
    plus that of ``root``'s other live descendants (from /proc, in clock ticks)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    ticks = 0
    for pid in tree_pids(root)[1:]:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total + ticks / CLOCK_TICKS


def tree_pss_bytes(root: int) -> int:
    """Summed proportional set size of ``root``'s tree (shared pages split, not double counted)."""
    total = 0
    for pid in tree_pids(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as rollup:
                for line in rollup:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, IndexError, ValueError):
            continue
    return total


PROCESS = "(process)"
ENDED = "(ended threads)"


def thread_cpu_seconds() -> dict[str, float]:
    """User + system CPU seconds of this process's live threads, summed by thread name with
    its trailing number dropped (``kolo-decode-1`` -> ``kolo-decode``), and of the whole
    process under ``PROCESS``."""
    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    out: dict[str, float] = {PROCESS: (int(fields[11]) + int(fields[12])) / CLOCK_TICKS}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                text = stat.read()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")].rstrip("0123456789").rstrip("-")
        fields = text.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


def cpu_by_thread(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each thread name used between two :func:`thread_cpu_seconds`; what threads
    that ended meanwhile used (a loader's, once its last epoch is out) under ``ENDED``."""
    used = {n: after[n] - before.get(n, 0.0) for n in after if n != PROCESS}
    used[ENDED] = max(after[PROCESS] - before[PROCESS] - sum(used.values()), 0.0)
    return used


def self_status_bytes(field: str) -> int:
    """A size field of /proc/self/status (VmHWM = peak RSS, RssAnon, RssFile, ...)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class MemorySampler:
    """Samples, every 0.1 s, this process's anonymous RSS (heap, not mapped files) and, for
    multi-process loaders, the summed PSS of the process tree."""

    def __init__(self, tree: bool) -> None:
        self.tree = tree
        self.peak_anon = self.peak_tree = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        self.peak_anon = max(self.peak_anon, self_status_bytes("RssAnon"))
        if self.tree:
            self.peak_tree = max(self.peak_tree, tree_pss_bytes(os.getpid()))

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()


def kolo_batches(spec: dict[str, Any]) -> Iterator[dict]:
    from kolo.data import ParquetLoader

    loader = ParquetLoader(
        spec["folder"],
        spec["columns"],
        batch_size=spec["batch_size"],
        rank=0,
        size=1,
        shuffle=True,
        seed=spec["seed"],
        num_epochs=spec["epochs"],
        drop_last=True,
        to="torch",
        shuffle_buffer_size=spec["shuffle_buffer"],
    )

    def batches() -> Iterator[dict]:
        try:
            yield from loader
        finally:
            spec["bytes_copied"] = loader.bytes_copied

    return batches()


def _column_array(column: Any) -> Any:
    """A pyarrow column as numpy: scalars 1-D, a fixed-length list column 2-D."""
    import pyarrow as pa

    if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type):
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        width = len(column[0]) if len(column) else 0
        return column.flatten().to_numpy().reshape(len(column), width)
    return column.to_numpy()


def pyarrow_batches(spec: dict[str, Any]) -> Iterator[dict]:
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    rng = np.random.default_rng(spec["seed"])
    columns, batch_size, capacity = spec["columns"], spec["batch_size"], spec["shuffle_buffer"]
    pending: list[dict[str, np.ndarray]] = []
    pending_rows = 0

    def drain(final: bool) -> Iterator[dict]:
        nonlocal pending, pending_rows
        merged = {c: np.concatenate([chunk[c] for chunk in pending]) for c in columns}
        order = rng.permutation(pending_rows)
        full = pending_rows - pending_rows % batch_size
        for start in range(0, full, batch_size):
            index = order[start : start + batch_size]
            yield {c: torch.from_numpy(merged[c][index]) for c in columns}
        rest = order[full:]
        pending = [{c: merged[c][rest] for c in columns}] if len(rest) and not final else []
        pending_rows = len(rest) if not final else 0

    for _ in range(spec["epochs"]):
        for file_index in rng.permutation(len(spec["files"])):
            parquet = pq.ParquetFile(spec["files"][file_index])
            for record_batch in parquet.iter_batches(batch_size=capacity, columns=columns):
                pending.append({c: _column_array(record_batch.column(c)) for c in columns})
                pending_rows += record_batch.num_rows
                if pending_rows >= capacity:
                    yield from drain(final=False)
        if pending_rows:
            yield from drain(final=True)


def ray_init(report: dict[str, Any]) -> None:
    """Starts Ray on this machine's 2 CPUs; reported apart from the loader's own time."""
    import ray
    import ray.data

    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    report["ray_init_s"] = time.perf_counter() - start
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False


def ray_batches(spec: dict[str, Any]) -> Iterator[dict]:
    import ray.data

    dataset = ray.data.read_parquet(spec["files"], shuffle="files").select_columns(spec["columns"])
    for epoch in range(spec["epochs"]):
        yield from dataset.iter_torch_batches(
            batch_size=spec["batch_size"],
            local_shuffle_buffer_size=spec["shuffle_buffer"],
            local_shuffle_seed=spec["seed"] + epoch,
            drop_last=True,
        )


def petastorm_batches(spec: dict[str, Any]) -> Iterator[dict]:
    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader

    reader = make_batch_reader(
        [f"file://{path}" for path in spec["files"]],
        schema_fields=spec["columns"],
        num_epochs=spec["epochs"],
        workers_count=2,
        shuffle_row_groups=True,
        seed=spec["seed"],
    )

    def pipeline() -> Iterator[dict]:
        with reader:
            loader = BatchedDataLoader(
                reader,
                batch_size=spec["batch_size"],
                shuffling_queue_capacity=spec["shuffle_buffer"],
            )
            yield from loader

    return pipeline()


PRELOAD = {
    "kolo": "import kolo.data",
    "pyarrow": "import numpy, pyarrow.parquet",
    "ray": "import ray.data",
    "petastorm": "import petastorm, petastorm.pytorch",
}
LOADERS = {
    "kolo": kolo_batches,
    "pyarrow": pyarrow_batches,
    "ray": ray_batches,
    "petastorm": petastorm_batches,
}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Times one pass of ``spec["loader"]``; CPU and RSS cover this whole process tree."""
    import torch

    name = spec["loader"]
    report: dict[str, Any] = {"loader": name}
    exec(PRELOAD[name])  # imports are not loader time
    if name == "ray":
        ray_init(report)
    sampler = MemorySampler(tree=name == "ray")
    label, probe = spec["columns"][-1], spec["columns"][0]
    batch_size = spec["batch_size"]
    epoch_rows = spec.get("epoch_rows") or float("inf")
    rows = count = 0
    first = None
    complete = True
    short = False
    # (rows, time, CPU) when each epoch's rows were out, and the CPU by thread then
    marks: list[tuple[int, float, float]] = []
    threads: list[dict[str, float]] = []
    cpu_start = cpu_first = tree_cpu_seconds(os.getpid())
    start = time.perf_counter()
    deadline = float("inf")
    batches = LOADERS[name](spec)
    for batch in batches:
        now = time.perf_counter()
        if first is None:
            first = now
            deadline = now + spec["seconds"]
            cpu_first = tree_cpu_seconds(os.getpid())
            threads.append(thread_cpu_seconds())
            report["shapes"] = {c: list(batch[c].shape) for c in spec["columns"]}
            report["dtypes"] = {c: str(batch[c].dtype).replace("torch.", "") for c in batch}
            report["all_tensors"] = all(isinstance(t, torch.Tensor) for t in batch.values())
        n = batch[label].shape[0]
        if short or n > batch_size or len(batch) < len(spec["columns"]):
            raise RuntimeError(f"{name}: a batch with {n} rows and {len(batch)} columns")
        short = n < batch_size  # Petastorm's last batch holds the remainder
        batch[label][-1].item()
        batch[probe].reshape(-1)[-1].item()
        rows += n
        count += 1
        if rows >= epoch_rows * (len(marks) + 1):
            marks.append((rows, time.perf_counter(), tree_cpu_seconds(os.getpid())))
            threads.append(thread_cpu_seconds())
        if count >= spec["max_batches"] or now >= deadline:
            complete = False
            break
    end = time.perf_counter()
    close = getattr(batches, "close", None)
    if close is not None:
        close()  # kolo's generator records the loader's bytes_copied
    if "bytes_copied" in spec:
        report["bytes_copied"] = spec["bytes_copied"]
        report["rows_total"] = rows
    if not rows:
        raise RuntimeError(f"{name} gave no batch")
    cpu_end = tree_cpu_seconds(os.getpid())
    sampler.stop()
    first = first or end
    first_rows, first_end, first_cpu = marks[0] if marks else (rows, end, cpu_end)
    report.update(
        rows=first_rows,
        batches=count,
        seconds=first_end - start,
        first_batch_s=first - start,
        steady_rows=max(first_rows - batch_size, 0),
        steady_seconds=first_end - first,
        cpu_s=first_cpu - cpu_start,
        steady_cpu_s=first_cpu - cpu_first,
        peak_rss_bytes=max(self_status_bytes("VmHWM"), sampler.peak_tree),
        # this process only: peak anonymous memory (sampled), and file-backed pages at the end
        peak_rss_anon_bytes=sampler.peak_anon,
        rss_file_end_bytes=self_status_bytes("RssFile"),
        complete_epoch=bool(marks) or (complete and epoch_rows == float("inf")),
        epochs_done=len(marks),
    )
    if len(threads) >= 2:
        # This process's threads only (the loader's own, for kolo and pyarrow).
        report["steady_cpu_s_by_thread"] = cpu_by_thread(threads[0], threads[1])
    if len(threads) >= 3:
        report["later_cpu_s_by_thread"] = cpu_by_thread(threads[1], threads[-1])
    if len(marks) >= 2:
        # Whole later epochs only: a run cut short in one (by the time cap) may have spent its
        # last seconds starting it (Ray re-plans and re-reads before its first batch).
        last_rows, last_end, last_cpu = marks[-1]
        report.update(
            later_rows=last_rows - first_rows,
            later_seconds=last_end - first_end,
            later_cpu_s=last_cpu - first_cpu,
        )
    return report


def main() -> None:
    spec = json.loads(sys.argv[1])
    report = run(spec)
    print("RESULT " + json.dumps(report), flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (Ray/Petastorm threads); the figures are out


if __name__ == "__main__":
    main()
