"""One rank of a large job on this machine (tests/test_scale_ranks.py, bench/scale_ranks.py):
``python scale_rank_worker.py MODE...`` under ``kolorun -np N``. Modes, run in the order given:

- ``matrix``: the collectives matrix on kolo's numpy layer (no framework loaded, so 64 ranks fit
  in memory): allreduce (Sum/Average/Min/Max x float32/float64/int32/float16), allgather
  (uneven first dimensions), broadcast (non-zero roots, one on another host), alltoall (uneven
  splits, some empty), reducescatter, a process set spanning the hosts, and join (odd ranks
  run one more allreduce than even ranks, which joined). Every rank checks every result
  against the exact expected values.
- ``latency``: small-allreduce latency (4 B, 4 KiB, 64 KiB float32; median of timed calls).
- ``train``: loads torch (one thread); a small model trained with
  ``kolo.torch.DistributedOptimizer`` after ``broadcast_parameters`` (every rank starts from
  different weights). Every rank checks that its parameters equal every other rank's bit for
  bit, and rank 0 that they equal one process training on all ranks' batches.

``KOLO_TEST_RANKS_PER_HOST=k`` makes task i claim the simulated host ``scalehost<i // k>``
(``KOLO_HOSTNAME``): shared memory within a host, TCP between hosts (the hierarchical path).

Each rank prints one line ``SCALE <json>`` (rank, size, local size, hosts, checks, failures,
timings, peak RSS) and exits 1 when any check failed. Every collective is bounded by
``KOLO_COLLECTIVE_TIMEOUT_SECONDS`` (the caller sets it), so a hang becomes an error.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np

import kolo
from kolo import _core, _lifecycle


def numpy_layer() -> tuple[types.ModuleType, types.ModuleType]:
    """kolo's numpy collectives (``kolo.keras._arrays``, ``kolo.tensorflow._array_ops``) without
    the packages' ``__init__`` (which load Keras and TensorFlow, ~700 MB per process): the
    two packages are registered as bare namespaces, so only the layer's own modules load."""
    root = Path(kolo.__file__).parent
    for package in ("keras", "tensorflow"):
        name = f"kolo.{package}"
        if name not in sys.modules:
            bare = types.ModuleType(name)
            bare.__path__ = [str(root / package)]
            sys.modules[name] = bare
    from kolo.keras import _arrays
    from kolo.tensorflow import _array_ops

    return _arrays, _array_ops


arrays, array_ops = numpy_layer()
failures: list[str] = []
checks = 0


def check(case: str, got: np.ndarray, expected: np.ndarray) -> None:
    global checks
    checks += 1
    if got.dtype != expected.dtype or got.shape != expected.shape:
        failures.append(
            f"{case}: got {got.dtype}{got.shape}, expected {expected.dtype}{expected.shape}"
        )
    elif not np.array_equal(got, expected):
        bad = np.flatnonzero(got.reshape(-1) != expected.reshape(-1))
        failures.append(
            f"{case}: {bad.size} of {got.size} values differ, first at {bad[0]}: "
            f"{got.reshape(-1)[bad[0]]} != {expected.reshape(-1)[bad[0]]}"
        )


def spread(rank: int, size: int) -> int:
    """Offsets that sum to 0 over the ranks (size even): so Sum is exactly size * base and
    Average exactly base for every dtype (float16 included)."""
    half = size // 2
    return rank if rank < half else -(rank - half)


DTYPES = ("float32", "float64", "int32", "float16")
ELEMENTS = 37  # odd, so no dtype's fused buffer lines up with anything


def allreduce_input(case: int, rank: int, size: int, dtype: str) -> np.ndarray:
    base = (np.arange(ELEMENTS) % 7) + case
    return (base + spread(rank, size) * ((np.arange(ELEMENTS) % 2) + 1)).astype(dtype)


def matrix() -> dict[str, float]:
    rank, size = _core.rank(), _core.size()
    world = kolo.global_process_set
    inputs = {
        d: [allreduce_input(i, r, size, d) for r in range(size)] for i, d in enumerate(DTYPES)
    }
    for op in (_core.Sum, _core.Average, _core.Min, _core.Max):
        names = [f"ar.{op.name}.{d}" for d in DTYPES]
        outs = arrays.allreduce([inputs[d][rank] for d in DTYPES], names, op, 1.0, 1.0, world)
        for name, dtype, got in zip(names, DTYPES, outs):
            stack = np.stack(inputs[dtype]).astype(np.float64)
            expected = {
                "Sum": stack.sum(0),
                "Average": stack.sum(0) / size,
                "Min": stack.min(0),
                "Max": stack.max(0),
            }[op.name]
            check(name, got, expected.astype(dtype))

    def rows_of(r: int) -> np.ndarray:
        return (r * 1000 + np.arange((r % 5 + 1) * 3)).reshape(r % 5 + 1, 3).astype(np.float32)

    (gathered,) = arrays.allgather([rows_of(rank)], ["ag.uneven"], world)
    check("allgather", gathered, np.concatenate([rows_of(r) for r in range(size)]))
    ints = np.array([rank] * (rank % 3), dtype=np.int32)
    (gathered,) = arrays.allgather([ints], ["ag.int32"], world)
    check(
        "allgather-empty-parts",
        gathered,
        np.concatenate([[r] * (r % 3) for r in range(size)]).astype(np.int32),
    )

    for root in (size - 1, size // 2 + 1):
        value = np.arange(1031, dtype=np.float64) * (root + 1)
        mine = value if rank == root else np.zeros_like(value)
        (got,) = arrays.broadcast([mine], root, [f"bc.{root}"], world)
        check(f"broadcast root {root}", got, value)

    def block(sender: int, receiver: int) -> np.ndarray:
        rows = (sender + receiver) % 3
        return (
            (sender * 10_000 + receiver * 10 + np.arange(rows * 2))
            .reshape(rows, 2)
            .astype(np.int32)
        )

    send = np.concatenate([block(rank, j) for j in range(size)])
    splits = np.array([(rank + j) % 3 for j in range(size)], dtype=np.int32)
    got, received = array_ops.alltoall(send, splits, "a2a.uneven", world)
    check("alltoall", got, np.concatenate([block(i, rank) for i in range(size)]))
    check(
        "alltoall splits", received, np.array([(i + rank) % 3 for i in range(size)], dtype=np.int32)
    )

    rows = 2 * size + 1

    def rs_input(r: int) -> np.ndarray:
        return (np.arange(rows * 4).reshape(rows, 4) + r).astype(np.float32)

    (part,) = arrays.reducescatter([rs_input(rank)], ["rs"], _core.Sum, 1.0, 1.0, world)
    total = sum(rs_input(r).astype(np.float64) for r in range(size))
    start = 2 * rank + min(rank, 1)
    check(
        "reducescatter", part, total[start : start + 2 + (1 if rank < 1 else 0)].astype(np.float32)
    )

    subset = PROCESS_SET
    if rank in subset.ranks:
        value = np.full(5, rank + 1, dtype=np.float32)
        (got,) = arrays.allreduce([value], ["ps.sum"], _core.Sum, 1.0, 1.0, subset)
        check(
            "process set allreduce", got, np.full(5, sum(r + 1 for r in subset.ranks), np.float32)
        )
        (got,) = arrays.allgather([np.array([rank], np.int64)], ["ps.ag"], subset)
        check("process set allgather", got, np.array(subset.ranks, np.int64))
    arrays.barrier(world)

    if rank % 2 == 1:
        own = np.full(3, rank, dtype=np.float32)
        (got,) = arrays.allreduce([own], ["join.odd"], _core.Sum, 1.0, 1.0, world)
        check("allreduce beside joined ranks", got, np.full(3, sum(range(1, size, 2)), np.float32))
    last = array_ops.join()
    (lasts,) = arrays.allgather([np.array([last], np.int64)], ["join.last"], world)
    check("join: every rank names the same last rank", lasts, np.full(size, lasts[0], np.int64))
    if lasts[0] % 2 != 1:
        failures.append(
            f"join: the last rank to join was {lasts[0]}, an even rank that joined first"
        )
    return {}


#: Timed calls per size in ``latency`` (after 5 untimed ones).
ITERATIONS = int(os.environ.get("KOLO_SCALE_ITERATIONS", "30"))


def latency() -> dict[str, float]:
    world = kolo.global_process_set
    out = {}
    for label, nbytes in (("4B", 4), ("4KiB", 4096), ("64KiB", 65536)):
        value = np.ones(nbytes // 4, dtype=np.float32)
        for _k in range(5):
            arrays.allreduce([value], [f"lat.warm.{label}"], _core.Sum, 1.0, 1.0, world)
        times = []
        for _k in range(ITERATIONS):
            began = time.perf_counter()
            (got,) = arrays.allreduce([value], [f"lat.{label}"], _core.Sum, 1.0, 1.0, world)
            times.append(time.perf_counter() - began)
        check(f"latency {label}", got, np.full(nbytes // 4, _core.size(), np.float32))
        out[f"allreduce_{label}_us"] = statistics.median(times) * 1e6
    return out


def train() -> dict[str, float]:
    import torch

    torch.set_num_threads(1)
    import kolo.torch as hvd

    rank, size = hvd.rank(), hvd.size()

    def model_for(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))

    def batch(r: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(r * 1000 + step)
        return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)

    steps = 4
    model = model_for(100 + rank)  # different on every rank: broadcast_parameters must fix it
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    step_times = []
    for step in range(steps):
        began = time.perf_counter()
        x, y = batch(rank, step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        step_times.append(time.perf_counter() - began)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    everyone = hvd.allgather(flat.unsqueeze(0), name="train.params")
    global checks
    checks += 1
    if not bool((everyone == flat).all()):
        differ = [r for r in range(size) if not torch.equal(everyone[r], flat)]
        failures.append(f"train: parameters differ from ranks {differ[:8]}")
    if rank == 0:
        reference = model_for(100)
        plain = torch.optim.SGD(reference.parameters(), lr=0.1)
        for step in range(steps):
            plain.zero_grad()
            for r in range(size):  # the mean over ranks of each rank's mean loss
                x, y = batch(r, step)
                (torch.nn.functional.mse_loss(reference(x), y) / size).backward()
            plain.step()
        expected = torch.cat([p.detach().reshape(-1) for p in reference.parameters()]).double()
        checks += 1
        if not torch.allclose(flat, expected, rtol=1e-4, atol=1e-5):
            worst = float((flat - expected).abs().max())
            failures.append(f"train: parameters are {worst} from one process's training")
    return {"train_step_ms": statistics.median(step_times[1:]) * 1e3}


def open_sockets() -> int:
    """How many sockets this process holds open (its data-plane TCP connections and listener,
    and its connection to the job driver)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:  # closed while listing (the listing's own descriptor)
            pass
    return count


def memory() -> dict[str, float]:
    """This process's memory now (MiB): ``pss`` (its share of every page it maps, so summing
    it over the ranks gives what the job really uses; torch's libraries are shared) and
    ``private`` (pages no other process maps)."""
    fields = {}
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) / 1024
    return {
        "pss_mib": fields.get("Pss", 0.0),
        "private_mib": fields.get("Private_Clean", 0.0) + fields.get("Private_Dirty", 0.0),
    }


def claim_simulated_host() -> None:
    per_host = os.environ.get("KOLO_TEST_RANKS_PER_HOST")
    if per_host:
        index = int(os.environ["KOLO_TASK_INDEX"])
        os.environ["KOLO_HOSTNAME"] = f"scalehost{index // int(per_host)}"


def main(modes: list[str]) -> int:
    """Runs ``modes`` as one rank; prints the ``SCALE`` line; returns the exit code."""
    started = time.time()
    claim_simulated_host()
    global PROCESS_SET
    size = int(os.environ.get("KOLO_SIZE") or os.environ.get("KOLO_NUM_TASKS") or 0)
    sets = []
    if size:
        # Every third rank from 1: on every simulated host, never the hosts' leaders only.
        PROCESS_SET = kolo.ProcessSet(list(range(1, size, 3)))
        sets.append(PROCESS_SET)
    _lifecycle.init(process_sets=sets)
    initialised = time.time()
    report: dict[str, object] = {
        "rank": _core.rank(),
        "size": _core.size(),
        "local_size": _core.local_size(),
        "cross_size": _core.cross_size(),
        "started": started,
        "initialised": initialised,
        # Data-plane connections right after init (where the engine counts them).
        "connections_at_init": _core.engine_stats().get("connections_open"),
    }
    for mode in modes:
        began = time.perf_counter()
        try:
            extra = {"matrix": matrix, "latency": latency, "train": train}[mode]()
        except Exception as exc:  # a collective that failed or timed out: report it, then exit 1
            failures.append(f"{mode}: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}")
            extra = {}
        report[f"{mode}_s"] = time.perf_counter() - began
        report.update(extra)
    stats = _core.engine_stats()
    # connections_open: an engine statistic of lazy connections, where the engine has it.
    report["connections_open"] = stats.get("connections_open")
    report["sockets"] = open_sockets()
    report["collectives"] = stats.get("collectives")
    report["shm_collectives"] = stats.get("shm_collectives")
    report["checks"] = checks
    report["failures"] = failures[:10]
    report["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report.update(memory())
    sys.stdout.flush()
    os.write(1, ("SCALE " + json.dumps(report) + "\n").encode())  # one write: lines never mix
    _lifecycle.shutdown()
    return 1 if failures else 0


def fork_ranks(deadline: float) -> int:
    """The zygote (``--fork SECONDS``): reads ``{"envs": [...], "modes": [...]}`` on stdin,
    loads torch and ``kolo.torch`` once, then forks one rank per environment (each a real
    process with its own engine; the pages torch's import wrote stay shared, so a rank costs
    tens of MiB instead of ~400). Waits at most ``deadline`` seconds for all of them, kills
    what is left, and returns 1 unless every rank exited 0. Nothing here starts kolo's runtime
    before the fork (only the children ``init``)."""
    job = json.load(sys.stdin)
    import torch

    torch.set_num_threads(1)
    import kolo.torch  # noqa: F401

    # The first optimizer of a process imports ~900 modules (torch._dynamo, sympy: ~1.8 s of
    # CPU); once here, not once per rank.
    warm = torch.nn.Linear(2, 2)
    torch.optim.SGD(warm.parameters(), lr=0.1).step()

    children = {}
    for env in job["envs"]:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.environ.update(env)
                code = main(job["modes"])
            finally:
                os._exit(code)
        children[pid] = env["KOLO_TASK_INDEX"]
    ends = time.monotonic() + deadline
    code = 0
    while children and time.monotonic() < ends:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
            continue
        task = children.pop(pid)
        if os.waitstatus_to_exitcode(status) != 0:
            print(f"task {task} exited with {os.waitstatus_to_exitcode(status)}", file=sys.stderr)
            code = 1
    for pid, task in children.items():
        print(f"task {task} still ran after {deadline} s: killed", file=sys.stderr)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        code = 1
    return code


PROCESS_SET: kolo.ProcessSet


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fork"]:
        sys.exit(fork_ranks(float(sys.argv[2])))
    sys.exit(main(sys.argv[1:] or ["matrix"]))
