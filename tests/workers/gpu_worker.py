"""One rank of the GPU suite (tests/test_gpu.py), started by kolorun; the mode is argv[1].

- ``nccl``: every NCCL collective and dtype through ``kolo.torch.nccl.NcclGroup`` against a
  reference computed with torch on the CPU, plus the pack kernel's copy and scaling.
- ``hvd``: ``hvd.allreduce`` & co. on CUDA tensors through the engine: allreduce and
  broadcast through NCCL on the device, the rest (and every op with ``KOLO_CUDA_STAGED=1``)
  host-staged.
- ``train``: a few DistributedOptimizer steps on ``argv[2]`` (``cuda`` or ``cpu``); prints the
  final parameters as JSON for the test to compare.

Every rank uses GPU ``local_rank % device_count`` (two ranks share a single GPU; set
``NCCL_HOSTID`` per rank then, which this worker does when ``KOLO_TEST_HOSTID_PER_RANK=1``).
"""

from __future__ import annotations

import json
import os
import sys

import torch

import kolo.torch as hvd

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int32, torch.int64]
# NCCL has no int16: those tensors take the host-staged path (checked in "staged").
NCCL_DTYPES = [*FLOATS, *INTS, torch.bool]


def device() -> torch.device:
    index = hvd.local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def rank_values(rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Deterministic small values per rank, exact in every dtype (sums stay below 100)."""
    n = 1
    for d in shape:
        n *= d
    base = (torch.arange(n, dtype=torch.int64) % 7 + rank * 3 + 1).reshape(shape)
    if dtype == torch.bool:
        return (base + rank) % 2 == 0
    return base.to(dtype)


def check(name: str, got: torch.Tensor, want: torch.Tensor, tol: float = 0.0) -> None:
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(
            f"{name}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}"
        )
    if tol == 0.0:
        ok = torch.equal(got, want)
    else:
        ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
    if not ok:
        raise AssertionError(
            f"{name}: got {got.flatten()[:8].tolist()}, want {want.flatten()[:8].tolist()}"
        )


def reduce_ref(values: list[torch.Tensor], op: str) -> torch.Tensor:
    dtype = values[0].dtype
    if dtype == torch.bool:
        stack = torch.stack(values)
        return stack.any(0) if op in ("Sum", "Max") else stack.all(0)
    stack = torch.stack([v.double() for v in values])
    out = {
        "Sum": stack.sum(0),
        "Min": stack.min(0).values,
        "Max": stack.max(0).values,
        "Product": stack.prod(0),
        "Average": stack.sum(0) / len(values),
    }[op]
    if dtype in INTS and op == "Average":
        out = out.trunc()
    return out.to(dtype)


def run_nccl() -> None:
    from kolo.torch.nccl import NcclGroup

    dev = device()
    group = NcclGroup(device=dev)
    size, rank = hvd.size(), hvd.rank()
    ops = {
        "Sum": hvd.Sum,
        "Min": hvd.Min,
        "Max": hvd.Max,
        "Product": hvd.Product,
        "Average": hvd.Average,
    }
    for dtype in NCCL_DTYPES:
        for name, op in ops.items():
            if dtype == torch.bool and name == "Average":
                continue
            shape = (5, 3)
            values = [rank_values(r, shape, dtype) for r in range(size)]
            # Fused: two tensors of one dtype in one call (pack kernel + one NCCL call).
            a = values[rank].clone().to(dev)
            b = values[rank][:2].clone().to(dev)
            group.allreduce_([a, b], op=op)
            tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
            want = reduce_ref(values, name)
            check(f"allreduce {dtype} {name}", a, want, tol if dtype in FLOATS else 0.0)
            check(f"allreduce {dtype} {name} (2nd)", b, want[:2], tol if dtype in FLOATS else 0.0)
            # Single tensor, in place without packing.
            c = values[rank].clone().to(dev)
            group.allreduce_(c, op=op)
            check(f"allreduce1 {dtype} {name}", c, want, tol if dtype in FLOATS else 0.0)
        if dtype in FLOATS:
            x = values_f = rank_values(rank, (4, 2), dtype).to(dev)
            group.allreduce_(
                [x, x.new_ones(3)], op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0
            )
            ref = reduce_ref([rank_values(r, (4, 2), dtype) for r in range(size)], "Sum").double()
            check(f"scaled allreduce {dtype}", values_f, (ref * 1.5).to(dtype), 1e-2)
        # broadcast from the last rank
        t = rank_values(rank, (6,), dtype).to(dev)
        group.broadcast_(t, root_rank=size - 1)
        check(f"broadcast {dtype}", t, rank_values(size - 1, (6,), dtype))
        # allgather with uneven first dimensions
        mine = rank_values(rank, (rank + 1, 2), dtype).to(dev)
        got = group.allgather(mine)
        want = torch.cat([rank_values(r, (r + 1, 2), dtype) for r in range(size)])
        check(f"allgather {dtype}", got, want)
        # reducescatter of 2*size+1 rows (uneven split)
        if dtype != torch.bool:
            rows = 2 * size + 1
            values = [rank_values(r, (rows, 2), dtype) for r in range(size)]
            part = group.reducescatter(values[rank].to(dev), op=hvd.Sum)
            full = reduce_ref(values, "Sum")
            counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
            start = sum(counts[:rank])
            check(f"reducescatter {dtype}", part, full[start : start + counts[rank]])
        # alltoall: rank r sends r+1 rows... to every peer p (p+1 rows to rank p)
        splits = [p + 1 for p in range(size)]
        send = rank_values(rank, (sum(splits), 2), dtype).to(dev)
        received, counts = group.alltoall(send, splits=splits)
        assert counts == [rank + 1] * size, counts
        parts = []
        for r in range(size):
            src = rank_values(r, (sum(splits), 2), dtype)
            start = sum(splits[:rank])
            parts.append(src[start : start + splits[rank]])
        check(f"alltoall {dtype}", received, torch.cat(parts))
    # The pack kernel alone: one launch, many tensors, every dtype, with scaling.
    for dtype in [*FLOATS, *INTS, torch.int16]:
        srcs = [rank_values(rank, (n,), dtype).to(dev) for n in (1, 7, 4096, 70000)]
        dsts = [torch.empty_like(s) for s in srcs]
        group.batched_copy(srcs, dsts)
        for s, d in zip(srcs, dsts):
            check(f"copy {dtype}", d, s.cpu())
        group.batched_copy(srcs, dsts, factor=0.5)
        for s, d in zip(srcs, dsts):
            ref = s.cpu().double() * 0.5
            ref = ref.trunc().to(torch.int64).to(dtype) if dtype not in FLOATS else ref.to(dtype)
            check(f"scaled copy {dtype}", d, ref, 1e-2 if dtype in FLOATS else 0.0)
    group.synchronize()
    torch.cuda.synchronize()
    print(f"rank {rank}: nccl ok", flush=True)


def run_hvd() -> None:
    from kolo.torch._staging import on_nccl

    dev = device()
    size, rank = hvd.size(), hvd.rank()
    staged = os.environ.get("KOLO_CUDA_STAGED") == "1"
    probe = torch.ones(2, device=dev)
    assert on_nccl(probe) == (not staged), "the engine's NCCL path is (not) taken as asked"
    for dtype in [*FLOATS, *INTS, torch.int16]:
        values = [rank_values(r, (5, 3), dtype) for r in range(size)]
        out = hvd.allreduce(values[rank].to(dev), op=hvd.Sum, name=f"staged.{dtype}")
        assert out.device == dev, out.device
        check(f"staged allreduce {dtype}", out, reduce_ref(values, "Sum"))
        t = values[rank].to(dev)
        hvd.allreduce_(t, op=hvd.Max, name=f"staged_.{dtype}")
        check(f"staged allreduce_ {dtype}", t, reduce_ref(values, "Max"))
        got = hvd.allgather(rank_values(rank, (rank + 1, 2), dtype).to(dev), name=f"ag.{dtype}")
        want = torch.cat([rank_values(r, (r + 1, 2), dtype) for r in range(size)])
        check(f"staged allgather {dtype}", got, want)
        b = rank_values(rank, (4,), dtype).to(dev)
        hvd.broadcast_(b, root_rank=0, name=f"bc.{dtype}")
        check(f"staged broadcast {dtype}", b, rank_values(0, (4,), dtype))
        # Two in-place allreduces in one cycle: fused on the device (or on the host).
        x, y = values[rank].to(dev), values[rank][:3].to(dev)
        hx = hvd.allreduce_async_(x, op=hvd.Sum, name=f"fx.{dtype}")
        hy = hvd.allreduce_async_(y, op=hvd.Sum, name=f"fy.{dtype}")
        hvd.synchronize(hx)
        hvd.synchronize(hy)
        check(f"fused allreduce_ {dtype}", x, reduce_ref(values, "Sum"))
        check(f"fused allreduce_ {dtype} (2nd)", y, reduce_ref(values, "Sum")[:3])
        if dtype in FLOATS:
            avg = hvd.allreduce(values[rank].to(dev), name=f"avg.{dtype}")
            want = reduce_ref([v.double() for v in values], "Average").to(dtype)
            check(f"average {dtype}", avg, want, 1e-2)
    torch.cuda.synchronize()
    print(f"rank {rank}: hvd ok ({'staged' if staged else 'nccl'})", flush=True)


def run_train(where: str) -> None:
    dev = device() if where == "cuda" else torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model = model.double().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(100 + hvd.rank())
    for _ in range(10):
        x = torch.randn(16, 8, generator=gen, dtype=torch.float64).to(dev)
        y = x.sum(1, keepdim=True).tanh()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    params = {k: v.detach().cpu().flatten().tolist() for k, v in model.state_dict().items()}
    if hvd.rank() == 0:
        print("PARAMS " + json.dumps(params), flush=True)


def main() -> None:
    hvd.init()
    if os.environ.get("KOLO_TEST_HOSTID_PER_RANK") == "1":
        # Ranks sharing one GPU must look like different hosts to NCCL.
        os.environ["NCCL_HOSTID"] = f"kolo-test-host-{hvd.rank()}"
    mode = sys.argv[1]
    if mode == "nccl":
        run_nccl()
    elif mode == "hvd":
        run_hvd()
    elif mode == "train":
        run_train(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {mode}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
