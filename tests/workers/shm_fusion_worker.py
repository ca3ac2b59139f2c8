"""Fused allreduces through shared memory, as real ranks under kolorun (tests/test_shm_fusion.py).

Every step submits a batch of tensors of mixed shapes and dtypes asynchronously, so the engine
fuses them (on shared memory a fused batch's tensors go straight through the shared segment,
with no fusion buffer), and checks every result on every rank against a reference. Also: a
tensor whose shape differs on one rank in the middle of a batch (it fails, its neighbours and
the next batch are exact), and a joined rank (its engine reduces stand-ins for the batch).

Prints ``DATA <name> <json>`` lines (engine counters per step) and ends with
``rank R: N failures`` (each failure also on stderr). With KOLO_TEST_RANKS_PER_HOST=k, task i
claims host "simhost<i // k>" (two simulated hosts: the hierarchical path).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from typing import Any

import torch

import kolo
import kolo.torch as hvd
from kolo.exceptions import MismatchError

failures: list[str] = []

#: Shapes of one batch: empty, one-element and odd-sized tensors around ones larger than the
#: one-phase allreduce (256 KiB), so the fused batch takes several rounds whose segments cross
#: tensor boundaries at odd offsets.
SHAPES: list[tuple[int, ...]] = [
    (1,),
    (3, 5),
    (70_001,),
    (0,),
    (257, 129),
    (1000,),
    (300_007,),
    (8,),
    (2, 3, 4),
]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int32]


def simulate_hosts() -> None:
    per_host = os.environ.get("KOLO_TEST_RANKS_PER_HOST")
    if per_host:
        index = int(os.environ["KOLO_TASK_INDEX"])
        os.environ["KOLO_HOSTNAME"] = f"simhost{index // int(per_host)}"


def value(rank: int, index: int, shape: tuple[int, ...], dtype: torch.dtype, salt: int):
    """Small integers (exact in every dtype, also summed over 4 ranks in bfloat16)."""
    numel = 1
    for d in shape:
        numel *= d
    flat = (torch.arange(numel, dtype=torch.int64) * 7 + rank * 3 + index * 5 + salt) % 11
    return flat.to(dtype).reshape(shape)


def expected(index: int, shape: tuple[int, ...], dtype: torch.dtype, salt: int, op: Any):
    inputs = [value(r, index, shape, dtype, salt).to(torch.float64) for r in range(hvd.size())]
    if op is hvd.Max:
        out = torch.stack(inputs).amax(0) if inputs[0].numel() else inputs[0]
    else:
        out = sum(inputs)
        if op is hvd.Average:
            out = out / hvd.size()
    return out.to(dtype)


def ops_for(dtype: torch.dtype) -> list[Any]:
    return [hvd.Sum, hvd.Max] if dtype == torch.int32 else [hvd.Sum, hvd.Average, hvd.Max]


#: Average multiplies by 1/size in the tensor's dtype, which may differ from x/size in the
#: last bit: relative tolerances for it (every other op is compared exactly).
AVERAGE_RTOL = {torch.float32: 1e-6, torch.float64: 1e-14, torch.bfloat16: 1 / 64}


def check(label: str, actual: torch.Tensor, want: torch.Tensor, op: Any = None) -> None:
    same = actual.dtype == want.dtype and actual.shape == want.shape
    if same and op is hvd.Average:
        rtol = AVERAGE_RTOL[want.dtype]
        same = torch.allclose(actual.double(), want.double(), rtol=rtol, atol=0)
    elif same:
        same = torch.equal(actual, want)
    if not same:
        failures.append(
            f"{label}: got {actual.dtype} {tuple(actual.shape)} {actual.flatten()[:6].tolist()}, "
            f"expected {want.dtype} {tuple(want.shape)} {want.flatten()[:6].tolist()}"
        )


def batch(
    salt: int, op: Any, dtype: torch.dtype, odd_one: int | None = None, grouped: bool = False
) -> None:
    """One fused batch: every shape in `dtype`, reduced with `op`. With `odd_one`, rank 1
    submits that tensor with one more element: it must fail with MismatchError on every rank
    while the rest of the batch is exact. With `grouped`, one grouped allreduce of the batch:
    it certainly enters one cycle on every rank, so it must run as one collective."""
    before = kolo.engine_stats()
    tensors = []
    for i, shape in enumerate(SHAPES):
        t = value(hvd.rank(), i, shape, dtype, salt)
        if i == odd_one and hvd.rank() == 1:
            t = torch.zeros(t.numel() + 1, dtype=dtype)
        tensors.append(t)
    label = f"batch {salt} {dtype} {op}"
    if grouped:
        hvd.synchronize(hvd.grouped_allreduce_async_(tensors, op=op, name=f"group.{salt}"))
        handles: list[Any] = [None] * len(tensors)
    else:
        # Submitted back to back (the engine starts a cycle once submissions pause), so the
        # batch is mostly agreed in one cycle and fused; on a loaded machine it may straddle
        # cycles.
        handles = [
            hvd.allreduce_async_(t, op=op, name=f"fuse.{salt}.{dtype}.{op}.{i}")
            for i, t in enumerate(tensors)
        ]
    for i, (shape, t, h) in enumerate(zip(SHAPES, tensors, handles)):
        if i == odd_one:
            try:
                hvd.synchronize(h)
                failures.append(f"{label}: tensor {i} of mismatched shapes raised nothing")
            except MismatchError:
                pass
            continue
        if h is not None:
            hvd.synchronize(h)
        check(f"{label} tensor {i} {shape}", t, expected(i, shape, dtype, salt, op), op)
    after = kolo.engine_stats()
    keys = ("tensors", "collectives", "shm_collectives", "fused_tensors")
    delta: dict[str, Any] = {k: after[k] - before[k] for k in keys}
    delta["dtype"] = str(dtype)
    delta["grouped"] = grouped
    print(f"DATA step {json.dumps(delta)}", flush=True)


def joined_batch(salt: int) -> None:
    """Rank 0 submits a batch while every other rank has joined: their engines reduce the
    op's identity for it (Sum: 0, Max: the lowest value), so rank 0 gets its own tensors."""
    if hvd.rank() == 0:
        tensors = [value(0, i, s, torch.float32, salt) for i, s in enumerate(SHAPES)]
        for op in (hvd.Sum, hvd.Max):
            outs = [t.clone() for t in tensors]
            handles = [
                hvd.allreduce_async_(t, op=op, name=f"joined.{salt}.{op}.{i}")
                for i, t in enumerate(outs)
            ]
            for i, (h, t) in enumerate(zip(handles, outs)):
                hvd.synchronize(h)
                check(f"joined batch {op} tensor {i}", t, tensors[i])
    hvd.join()


def main() -> int:
    faulthandler.dump_traceback_later(150, exit=True)
    simulate_hosts()
    hvd.init()
    salt = 0
    for dtype in DTYPES:
        for op in ops_for(dtype):
            salt += 1
            batch(salt, op, dtype, grouped=op is hvd.Sum)
    # A rank error in the middle of a fused batch, then a batch that must be exact again.
    batch(100, hvd.Sum, torch.float32, odd_one=4)
    batch(101, hvd.Sum, torch.float32)
    joined_batch(102)
    batch(103, hvd.Average, torch.float32)
    stats = kolo.engine_stats()
    print(f"DATA totals {json.dumps(stats)}", flush=True)
    for failure in failures[:20]:
        print(f"FAIL {failure}", file=sys.stderr)
    print(f"rank {hvd.rank()}: {len(failures)} failures", flush=True)
    hvd.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
