"""Checks every collective x dtype x op against a NumPy/torch reference on this job's ranks.

Run under kolorun with any number of ranks; every rank builds every rank's inputs from a seed,
computes the expected result locally and compares. Prints one summary line per rank and exits
non-zero on any difference. With KOLO_TEST_SUBSET=0,2 (say) the same matrix runs on that process
set instead of the whole job (the other ranks only wait for it).

It also checks the data plane: ``engine_stats()["shm_collectives"]`` must equal
``collectives`` when KOLO_TRANSPORT is shm or the job is simulated hosts (hierarchical), and
be 0 with KOLO_TRANSPORT=tcp.
"""

from __future__ import annotations

import functools
import os
import sys
import zlib
from typing import Any

import numpy as np
import torch

import kolo
import kolo.torch as hvd

FLOAT_TOLERANCE = {
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
    torch.float32: 1e-5,
    torch.float64: 1e-12,
}
DTYPES = [
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
]
OPS = {
    "Sum": hvd.Sum,
    "Average": hvd.Average,
    "Min": hvd.Min,
    "Max": hvd.Max,
    "Product": hvd.Product,
}

failures: list[str] = []
checked = 0


def data(case: str, rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Deterministic input of `rank` for `case`; small values so products and sums stay exact."""
    rng = np.random.default_rng(zlib.crc32(f"{case}/{rank}".encode()))
    if dtype == torch.bool:
        values = rng.integers(0, 2, size=shape).astype(bool)
    elif dtype == torch.uint8:
        values = rng.integers(0, 4, size=shape)
    elif dtype.is_floating_point:
        # Quarters, drawn as int8 and scaled in `dtype` (exact): the 68 MiB cases draw fast.
        quarters = np.asarray(rng.integers(-8, 9, size=shape, dtype=np.int8))
        return torch.from_numpy(quarters).to(dtype) / 4
    else:
        values = rng.integers(-3, 4, size=shape)
    return torch.from_numpy(np.asarray(values)).to(dtype)


def reduce_reference(inputs: list[torch.Tensor], op: str, pre: float, post: float) -> torch.Tensor:
    """The expected reduction, with kolo's documented semantics."""
    dtype = inputs[0].dtype
    n = len(inputs)
    if dtype == torch.bool:
        stacked = torch.stack(inputs)
        return stacked.any(0) if op in ("Sum", "Max") else stacked.all(0)
    if dtype.is_floating_point and op in ("Sum", "Average"):
        out = inputs[0].double() * pre
        for t in inputs[1:]:
            out += t.double() * pre
        if op == "Average":
            out = out / n
        return (out * post).to(dtype)
    if dtype.is_floating_point:
        stacked = torch.stack([t.double() * pre for t in inputs])
        if op == "Min":
            out = stacked.min(0).values
        elif op == "Max":
            out = stacked.max(0).values
        else:
            out = stacked.prod(0)
        return (out * post).to(dtype)
    arrays = [t.numpy() for t in inputs]
    np_dtype = arrays[0].dtype
    if pre != 1.0:
        arrays = [np.trunc(a.astype(np.float64) * pre).astype(np_dtype) for a in arrays]
    stacked = np.stack(arrays)
    with np.errstate(over="ignore"):
        if op in ("Sum", "Average"):
            out = stacked.sum(0, dtype=np_dtype)
        elif op == "Min":
            out = stacked.min(0)
        elif op == "Max":
            out = stacked.max(0)
        else:
            out = stacked.prod(0, dtype=np_dtype)
    factor = post / n if op == "Average" else post
    if factor != 1.0:
        out = np.trunc(out.astype(np.float64) * factor).astype(np_dtype)
    return torch.from_numpy(np.array(out))


def check(label: str, actual: torch.Tensor, expected: torch.Tensor, int_slack: int = 0) -> None:
    global checked
    checked += 1
    if actual.dtype != expected.dtype or tuple(actual.shape) != tuple(expected.shape):
        failures.append(
            f"{label}: got {actual.dtype} {tuple(actual.shape)}, "
            f"expected {expected.dtype} {tuple(expected.shape)}"
        )
        return
    if expected.dtype.is_floating_point:
        # Most cases are exact; the tolerance is for Average and the scale factors.
        ok = torch.equal(actual, expected) or torch.allclose(
            actual.double(), expected.double(), rtol=FLOAT_TOLERANCE[expected.dtype], atol=1e-6
        )
    elif expected.dtype == torch.bool or int_slack == 0:
        ok = torch.equal(actual, expected)
    else:
        ok = actual.numel() == 0 or bool(
            (actual.long() - expected.long()).abs().max().item() <= int_slack
        )
    if not ok:
        failures.append(f"{label}: got {actual.flatten()[:8]} expected {expected.flatten()[:8]}")


def ops_for(dtype: torch.dtype) -> list[str]:
    return [op for op in OPS if not (dtype == torch.bool and op == "Average")]


def check_allreduce(size: int, rank: int) -> None:
    for dtype in DTYPES:
        for shape in [(0,), (1,), (1023,), (3, 5), ()]:
            for op in ops_for(dtype):
                case = f"allreduce/{dtype}/{shape}/{op}"
                inputs = [data(case, r, shape, dtype) for r in range(size)]
                result = hvd.allreduce(inputs[rank], op=OPS[op], name=case)
                slack = 1 if op == "Average" else 0
                check(case, result, reduce_reference(inputs, op, 1.0, 1.0), slack)
                inplace = inputs[rank].clone()
                hvd.allreduce_(inplace, op=OPS[op], name=case + "/inplace")
                check(case + "/inplace", inplace, result)
        if dtype != torch.bool:
            for pre, post in [(0.5, 3.0), (2.0, 1.0)]:
                case = f"allreduce-scaled/{dtype}/{pre}/{post}"
                inputs = [data(case, r, (257,), dtype) for r in range(size)]
                for op in ["Sum", "Average"]:
                    result = hvd.allreduce(
                        inputs[rank],
                        op=OPS[op],
                        prescale_factor=pre,
                        postscale_factor=post,
                        name=f"{case}/{op}",
                    )
                    slack = 1 if not dtype.is_floating_point else 0
                    check(f"{case}/{op}", result, reduce_reference(inputs, op, pre, post), slack)


def check_allreduce_layouts(size: int, rank: int) -> None:
    """The paths behind allreduce: contiguous CPU tensors run in place (no copy, no autograd
    node without grad); strided ones, grad-tracking ones and in-place on a view still give
    the reference, write back where asked and keep the input unchanged otherwise."""
    expected_sum = sum(range(size))
    base = torch.full((4, 6), float(rank))
    strided = base.t()  # not contiguous
    inplace = torch.full((4, 6), float(rank)).t()  # strided too
    hvd.allreduce_(inplace, op=hvd.Sum, name="layouts/inplace-strided")
    check("layouts/inplace-strided", inplace, torch.full((6, 4), float(expected_sum)))
    out = hvd.allreduce(strided, op=hvd.Sum, name="layouts/strided")
    check("layouts/strided", out, torch.full((6, 4), float(expected_sum)))
    check("layouts/strided input kept", strided, torch.full((6, 4), float(rank)))
    view = torch.zeros(3, 4)
    view[1].fill_(float(rank + 1))
    hvd.allreduce_(view[1], op=hvd.Sum, name="layouts/row-view")
    check("layouts/row-view", view[1], torch.full((4,), float(sum(r + 1 for r in range(size)))))
    check("layouts/row-view neighbours", view[0], torch.zeros(4))
    leaf = torch.full((5,), float(rank), requires_grad=True)
    result = hvd.allreduce(leaf, op=hvd.Sum, name="layouts/grad")
    (result * 2).sum().backward()
    check("layouts/grad forward", result.detach(), torch.full((5,), float(expected_sum)))
    check("layouts/grad backward", leaf.grad, torch.full((5,), 2.0 * size))
    with torch.no_grad():
        plain = hvd.allreduce(leaf, op=hvd.Sum, name="layouts/no-grad")
    if plain.requires_grad or plain.grad_fn is not None:
        failures.append("layouts/no-grad: a result under no_grad tracks gradients")
    check("layouts/no-grad", plain, torch.full((5,), float(expected_sum)))


def check_allgather(size: int, rank: int) -> None:
    for dtype in DTYPES:
        for variant in range(3):
            rows = [(r + variant) % 3 for r in range(size)]  # uneven, sometimes 0
            case = f"allgather/{dtype}/{variant}"
            inputs = [data(case, r, (rows[r], 3), dtype) for r in range(size)]
            result = hvd.allgather(inputs[rank], name=case)
            check(case, result, torch.cat(inputs))
        case = f"allgather-1d/{dtype}"
        inputs = [data(case, r, (1023 + r,), dtype) for r in range(size)]
        check(case, hvd.allgather(inputs[rank], name=case), torch.cat(inputs))


def check_broadcast(size: int, rank: int) -> None:
    for dtype in DTYPES:
        for root in range(size):
            for shape in [(0,), (1,), (1023,), (2, 3), ()]:
                case = f"broadcast/{dtype}/{root}/{shape}"
                inputs = [data(case, r, shape, dtype) for r in range(size)]
                result = hvd.broadcast(inputs[rank], root_rank=root, name=case)
                check(case, result, inputs[root])
                inplace = inputs[rank].clone()
                hvd.broadcast_(inplace, root_rank=root, name=case + "/inplace")
                check(case + "/inplace", inplace, inputs[root])


def splits_of(sender: int, size: int, variant: int) -> list[int]:
    return [(sender + receiver + variant) % 3 for receiver in range(size)]


def check_alltoall(size: int, rank: int) -> None:
    for dtype in DTYPES:
        for variant in range(3):
            case = f"alltoall/{dtype}/{variant}"
            all_splits = [splits_of(r, size, variant) for r in range(size)]
            inputs = [data(case, r, (sum(all_splits[r]), 2), dtype) for r in range(size)]
            output, received = hvd.alltoall(inputs[rank], splits=all_splits[rank], name=case)
            pieces = []
            for sender in range(size):
                start = sum(all_splits[sender][:rank])
                pieces.append(inputs[sender][start : start + all_splits[sender][rank]])
            check(case, output, torch.cat(pieces))
            expected_received = torch.tensor([all_splits[s][rank] for s in range(size)])
            check(case + "/received", received.long(), expected_received)
        case = f"alltoall-even/{dtype}"
        inputs = [data(case, r, (2 * size, 3), dtype) for r in range(size)]
        output = hvd.alltoall(inputs[rank], name=case)
        check(case, output, torch.cat([inputs[s][2 * rank : 2 * rank + 2] for s in range(size)]))


def check_reducescatter(size: int, rank: int) -> None:
    for dtype in DTYPES:
        for rows in [7, size, 1]:
            for op in ops_for(dtype):
                case = f"reducescatter/{dtype}/{rows}/{op}"
                inputs = [data(case, r, (rows, 3), dtype) for r in range(size)]
                result = hvd.reducescatter(inputs[rank], op=OPS[op], name=case)
                full = reduce_reference(inputs, op, 1.0, 1.0)
                counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
                start = sum(counts[:rank])
                slack = 1 if op == "Average" else 0
                check(case, result, full[start : start + counts[rank]], slack)


def check_large(size: int, rank: int) -> None:
    elements = 5 * 1024 * 1024  # 20 MiB of float32
    for dtype in [torch.float32, torch.bfloat16]:
        case = f"large-allreduce/{dtype}"
        inputs = [data(case, r, (elements,), dtype) for r in range(size)]
        result = hvd.allreduce(inputs[rank], op=hvd.Sum, name=case)
        check(case, result, reduce_reference(inputs, "Sum", 1.0, 1.0))
    case = "large-allgather"
    inputs = [data(case, r, (elements + r, 1), torch.float32) for r in range(size)]
    check(case, hvd.allgather(inputs[rank], name=case), torch.cat(inputs))
    case = "large-broadcast"
    inputs = [data(case, r, (elements,), torch.float32) for r in range(size)]
    check(case, hvd.broadcast(inputs[rank], root_rank=size - 1, name=case), inputs[size - 1])


def check_objects(size: int, rank: int) -> None:
    global checked
    gathered = hvd.allgather_object({"rank": rank, "payload": "x" * rank})
    expected = [{"rank": r, "payload": "x" * r} for r in range(size)]
    checked += 1
    if gathered != expected:
        failures.append(f"allgather_object: {gathered} != {expected}")
    value = hvd.broadcast_object({"from": rank} if rank == size - 1 else None, root_rank=size - 1)
    checked += 1
    if value != {"from": size - 1}:
        failures.append(f"broadcast_object: {value}")
    hvd.barrier()


def simulate_hosts() -> None:
    """With KOLO_TEST_RANKS_PER_HOST=k, task i claims host "simhost<i // k>" (KOLO_HOSTNAME), so
    one machine runs a job of several simulated hosts with k ranks each."""
    per_host = os.environ.get("KOLO_TEST_RANKS_PER_HOST")
    if per_host:
        index = int(os.environ["KOLO_TASK_INDEX"])
        os.environ["KOLO_HOSTNAME"] = f"simhost{index // int(per_host)}"


def check_huge(size: int, rank: int) -> None:
    """One allreduce, allgather and broadcast above 64 MiB (KOLO_TEST_HUGE=1)."""
    if not os.environ.get("KOLO_TEST_HUGE"):
        return
    elements = 17 * 1024 * 1024 + 3  # 68 MiB of float32
    case = "huge-allreduce"
    inputs = [data(case, r, (elements,), torch.float32) for r in range(size)]
    result = hvd.allreduce(inputs[rank], op=hvd.Sum, name=case)
    check(case, result, reduce_reference(inputs, "Sum", 1.0, 1.0))
    del inputs, result
    case = "huge-allgather"
    rows = elements // max(size, 1) + 1
    mine = data(case, rank, (rows + rank,), torch.float32)
    gathered = hvd.allgather(mine, name=case)
    check(
        case, gathered, torch.cat([data(case, r, (rows + r,), torch.float32) for r in range(size)])
    )
    del gathered
    case = "huge-broadcast"
    value = data(case, 0, (elements,), torch.float32)
    mine = value if rank == 0 else torch.zeros(elements)
    check(case, hvd.broadcast(mine, root_rank=0, name=case), value)


#: The collectives that take ``process_set=``, and those whose ``root_rank`` is a global rank.
SET_OPS = {"allreduce", "allreduce_", "allgather", "alltoall", "reducescatter"}
SET_OPS |= {"allgather_object", "barrier"}
ROOTED_OPS = {"broadcast", "broadcast_", "broadcast_object"}


class OnSet:
    """``kolo.torch`` with every collective run on process set ``ps``; the suites pass roots
    as set ranks, which this maps to the global ranks kolo takes."""

    def __init__(self, module: Any, ps: Any) -> None:
        self.module, self.ps = module, ps

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.module, name)
        if name in SET_OPS:
            return functools.partial(fn, process_set=self.ps)
        if name in ROOTED_OPS:

            def rooted(*args: Any, root_rank: int = 0, **kwargs: Any) -> Any:
                root = self.ps.ranks[root_rank]
                return fn(*args, root_rank=root, process_set=self.ps, **kwargs)

            return rooted
        return fn


def check_data_plane() -> None:
    """Every collective ran on a shared-memory plane (flat, or hierarchical across simulated
    hosts), or none did, as configured."""
    global checked
    stats = kolo.engine_stats()
    transport = os.environ.get("KOLO_TRANSPORT", "auto")
    checked += 1
    if transport == "tcp" or hvd.size() == 1:
        if stats["shm_collectives"] != 0:
            failures.append(f"data plane: {stats['shm_collectives']} collectives used shm")
    elif stats["shm_collectives"] != stats["collectives"]:
        failures.append(
            f"data plane: {stats['shm_collectives']} of {stats['collectives']} collectives used shm"
        )


def finished_everywhere() -> None:
    """Waits for every rank of the job (named: the set's own barriers count unnamed ones)."""
    kolo.torch.allreduce(torch.zeros(1), name="worker.finished")


def main() -> int:
    global hvd
    simulate_hosts()
    subset = os.environ.get("KOLO_TEST_SUBSET")
    ps = kolo.ProcessSet([int(r) for r in subset.split(",")]) if subset else None
    hvd.init(process_sets=[ps] if ps else None)
    size, rank = hvd.size(), hvd.rank()
    if ps is not None:
        if not ps.included():
            finished_everywhere()
            print(f"rank {rank}: not in process set {list(ps.ranks)}")
            hvd.shutdown()
            return 0
        hvd = OnSet(hvd, ps)
        size, rank = ps.size(), ps.rank()
    for suite in [
        check_allreduce,
        check_allreduce_layouts,
        check_allgather,
        check_broadcast,
        check_alltoall,
        check_reducescatter,
        check_large,
        check_huge,
        check_objects,
    ]:
        suite(size, rank)
        if os.environ.get("KOLO_TEST_VERBOSE"):
            print(f"rank {rank}: {suite.__name__} done", flush=True)
    check_data_plane()
    if ps is not None:
        finished_everywhere()
    for failure in failures[:20]:
        print(f"FAIL {failure}", file=sys.stderr)
    print(f"rank {rank} of {size}: checked {checked} cases, {len(failures)} failures")
    hvd.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
