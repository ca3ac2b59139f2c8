"""GPU benchmark: the fusion pack/unpack kernel, single-rank NCCL allreduce latency, and
pinned host<->device copies of loader-sized batches.

    python bench/gpu.py [--check] [--iters 50] [--json PATH]

1. **pack/unpack** of ResNet-50's 161 float32 gradients (97.5 MiB; shapes from
   bench/fusion.py) into a fusion buffer laid out like kolo's (each tensor at a multiple of
   256 bytes), with one launch of kolo's batched copy kernel, against: one
   ``cudaMemcpyDtoD`` of the same bytes (one contiguous ``copy_``; the target is kolo ≥ 85 %
   of it), one ``cudaMemcpyAsync`` per tensor (``copy_`` per tensor) and ``torch.cat``. GB/s
   count the bytes copied once (read + write is twice that on the memory bus).
2. **NCCL allreduce latency**, one rank: kolo's NCCL group (``kolo.torch.nccl.NcclGroup``)
   against ``torch.distributed`` with the NCCL backend and world size 1, host-measured
   (submit to ``torch.cuda.synchronize()``), median of ``--iters``, for 4 B to 64 MiB.
3. **pinned H2D/D2H** of a 64 MiB loader batch: pageable ``.to(device)``,
   ``pin_memory().to(non_blocking=True)`` (pinning each batch) and a reused pinned staging
   buffer (how a loader that delivers pinned batches, or kolo's staged path, copies).

``--check`` runs everything small and few times and verifies the pack/unpack results; it is
what the GPU test suite's smoke run uses. Needs a CUDA GPU (exits with a message otherwise).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from common import free_port, human, write_results
from fusion import resnet50_gradient_shapes

import kolo.torch as hvd

ALIGN = 256  # kolo's fusion-buffer alignment (collective/src/cuda/plan.rs)


def cuda_time(fn: Callable[[], Any], iters: int, warmup: int = 3) -> float:
    """Seconds per call of ``fn`` measured with CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0 / iters


def host_latency(fn: Callable[[], Any], iters: int, warmup: int = 3) -> float:
    """Median seconds from submitting ``fn`` to the device having finished it."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def fusion_views(srcs: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A fusion buffer with kolo's layout and one view per tensor into it."""
    offsets, at = [], 0
    for s in srcs:
        offsets.append(at)
        at = -(-(at + s.numel() * s.element_size()) // ALIGN) * ALIGN
    buf = torch.empty(at, dtype=torch.uint8, device=srcs[0].device)
    views = [
        buf[o : o + s.numel() * s.element_size()].view(s.dtype).view(s.shape)
        for o, s in zip(offsets, srcs)
    ]
    return buf, views


def bench_pack(group: Any, dev: torch.device, scale: int, iters: int, check: bool) -> dict:
    shapes = [shape for _, shape in resnet50_gradient_shapes()]
    srcs = []
    for i, shape in enumerate(shapes):
        n = max(1, int(torch.Size(shape).numel()) // scale)
        srcs.append(torch.randn(n, device=dev) + i)
    total = sum(s.numel() * s.element_size() for s in srcs)
    _, views = fusion_views(srcs)
    flat_src = torch.cat([s.view(-1) for s in srcs])
    flat_dst = torch.empty_like(flat_src)
    cat_out = torch.empty_like(flat_src)

    def kolo_pack() -> None:
        group.batched_copy(srcs, views)

    def kolo_unpack() -> None:
        group.batched_copy(views, srcs)

    def dtod() -> None:
        flat_dst.copy_(flat_src)

    def per_tensor() -> None:
        for s, v in zip(srcs, views):
            v.copy_(s)

    def cat() -> None:
        torch.cat([s.view(-1) for s in srcs], out=cat_out)

    if check:
        kolo_pack()
        torch.cuda.synchronize()
        assert all(torch.equal(s, v) for s, v in zip(srcs, views)), "pack copied wrong bytes"
        for v in views:
            v.mul_(2)
        kolo_unpack()
        torch.cuda.synchronize()
        assert all(torch.equal(s, v) for s, v in zip(srcs, views)), "unpack copied wrong bytes"
        group.batched_copy(srcs, views, factor=0.5)
        torch.cuda.synchronize()
        assert all(torch.allclose(v, s * 0.5) for s, v in zip(srcs, views)), "scaling is off"
        print("pack check: pack, unpack and scaled pack are exact", flush=True)
    results = {}
    for label, fn in [
        ("kolo_pack", kolo_pack),
        ("kolo_unpack", kolo_unpack),
        ("memcpy_dtod", dtod),
        ("memcpy_per_tensor", per_tensor),
        ("torch_cat", cat),
    ]:
        seconds = cuda_time(fn, iters)
        results[label] = {"seconds": seconds, "gb_per_s": total / seconds / 1e9}
    base = results["memcpy_dtod"]["gb_per_s"]
    print(f"pack/unpack of {len(srcs)} tensors, {human(total)}:", flush=True)
    for label, r in results.items():
        print(
            f"  {label:18s} {r['gb_per_s']:8.1f} GB/s  {r['seconds'] * 1e6:9.1f} us  "
            f"{r['gb_per_s'] / base * 100:6.1f} % of one DtoD memcpy",
            flush=True,
        )
    return {"tensors": len(srcs), "bytes": total, "results": results}


def bench_allreduce(group: Any, dev: torch.device, iters: int, sizes: list[int]) -> dict:
    import torch.distributed as dist

    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    rows = []
    try:
        for nbytes in sizes:
            t = torch.ones(max(1, nbytes // 4), device=dev)
            kolo_s = host_latency(lambda t=t: group.allreduce_(t, op=hvd.Sum), iters)
            torch_s = host_latency(lambda t=t: dist.all_reduce(t), iters)
            rows.append({"bytes": nbytes, "kolo_s": kolo_s, "torch_s": torch_s})
            print(
                f"  allreduce {human(nbytes):>9s}: kolo {kolo_s * 1e6:8.1f} us, "
                f"torch.distributed {torch_s * 1e6:8.1f} us, ratio {kolo_s / torch_s:5.2f}",
                flush=True,
            )
    finally:
        dist.destroy_process_group()
    return {"rows": rows}


def bench_h2d(dev: torch.device, nbytes: int, iters: int) -> dict:
    batch = torch.randn(nbytes // 4)
    staging = torch.empty_like(batch).pin_memory()
    on_device = torch.empty_like(batch, device=dev)
    back = torch.empty_like(batch).pin_memory()

    def pageable() -> None:
        on_device.copy_(batch)

    def pin_each() -> None:
        on_device.copy_(batch.pin_memory(), non_blocking=True)

    def reused_pinned() -> None:
        staging.copy_(batch)
        on_device.copy_(staging, non_blocking=True)

    def pinned_only() -> None:
        on_device.copy_(staging, non_blocking=True)

    def d2h_pinned() -> None:
        back.copy_(on_device, non_blocking=True)

    def d2h_pageable() -> None:
        batch.copy_(on_device)

    out = {}
    print(f"host<->device copies of a {human(nbytes)} batch:", flush=True)
    for label, fn in [
        ("h2d_pageable", pageable),
        ("h2d_pin_memory_each_batch", pin_each),
        ("h2d_reused_pinned_staging", reused_pinned),
        ("h2d_pinned_copy_only", pinned_only),
        ("d2h_pinned", d2h_pinned),
        ("d2h_pageable", d2h_pageable),
    ]:
        seconds = host_latency(fn, iters)
        out[label] = {"seconds": seconds, "gb_per_s": nbytes / seconds / 1e9}
        print(f"  {label:28s} {out[label]['gb_per_s']:7.1f} GB/s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="small, quick, verified run")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA GPU (torch.cuda.is_available() is False)")
        sys.exit(2)
    from kolo.torch.nccl import NcclGroup, probe

    hvd.init()
    dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    found = probe()
    print(
        f"GPU {torch.cuda.get_device_name(dev)}, NCCL {found.get('nccl_version')}, "
        f"NVRTC {found.get('nvrtc_version')}",
        flush=True,
    )
    group = NcclGroup(device=dev)
    iters = 5 if args.check else args.iters
    payload: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(dev),
        "nccl": found.get("nccl_version"),
        "check": args.check,
    }
    payload["pack"] = bench_pack(group, dev, 64 if args.check else 1, iters, check=True)
    sizes = [4, 4096, 1 << 20] if args.check else [4, 4096, 1 << 20, 16 << 20, 64 << 20]
    print("single-rank NCCL allreduce latency:", flush=True)
    payload["allreduce"] = bench_allreduce(group, dev, iters, sizes)
    payload["h2d"] = bench_h2d(dev, (1 << 20) if args.check else (64 << 20), iters)
    group.synchronize()
    write_results("gpu", payload, args.json)
    hvd.shutdown()


if __name__ == "__main__":
    main()
