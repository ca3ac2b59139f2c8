"""Horovod 0.28.1's semantics at the edges of the torch API, checked on 2 real ranks.

Every expectation below is Horovod's definition (``horovod/torch/mpi_ops.py``,
``horovod/torch/functions.py``, ``ScaleBufferCPUImpl`` in ``horovod/common/ops``), computed here
independently of kolo: the gradients of the collectives, the grouped collectives' gradients,
pre/post-scaling bit for bit against a NumPy re-implementation, ``join()`` with allgather and
broadcast, ``broadcast_optimizer_state`` before any gradient, ``sparse_allreduce_async``, and
the builtin classes of a collective's errors. Prints ``CHECK <name> ok|FAIL ...`` per check and
one summary line per rank; exits non-zero on any failure.

With the argument ``kill``, rank 1 SIGKILLs itself inside an allreduce loop and rank 0 reports
which classes its error is (``RuntimeError``, ``HorovodInternalError``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

import kolo.torch as hvd
from kolo.common.exceptions import HorovodInternalError

failures: list[str] = []
checked = 0


def check(name: str, run: Callable[[], None]) -> None:
    global checked
    checked += 1
    try:
        run()
    except Exception as err:  # every failure is reported by name
        failures.append(name)
        print(f"CHECK {name} FAIL {type(err).__name__}: {err}", flush=True)
    else:
        print(f"CHECK {name} ok", flush=True)


def same(label: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{label}: got {got.flatten()[:6]} want {want.flatten()[:6]}")


# --- gradients --------------------------------------------------------------------------------


def grad_of(x: torch.Tensor, out: torch.Tensor, upstream: torch.Tensor) -> torch.Tensor:
    (out * upstream).sum().backward()
    return x.grad


def upstream_of(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The gradient flowing into an op's output on ``rank``: distinct per rank and element."""
    return torch.arange(float(np.prod(shape))).reshape(shape) + 10.0 * (rank + 1)


def check_gradients(rank: int, size: int) -> None:
    ups = [upstream_of(r, (3, 2)) for r in range(size)]

    def broadcast_grad() -> None:
        # Horovod: allreduce(grad, Average) on the root, zeros on the other ranks.
        x = torch.full((3, 2), float(rank + 1), requires_grad=True)
        got = grad_of(x, hvd.broadcast(x, root_rank=1), ups[rank])
        want = sum(ups) / size if rank == 1 else torch.zeros(3, 2)
        same("broadcast grad", got, want)

    def allgather_grad() -> None:
        # Horovod: this rank's rows of allreduce(grad, Average).
        rows = [1, 2]
        x = torch.ones(rows[rank], 2, requires_grad=True)
        gathered_ups = [upstream_of(r, (sum(rows), 2)) for r in range(size)]
        got = grad_of(x, hvd.allgather(x), gathered_ups[rank])
        start = sum(rows[:rank])
        same("allgather grad", got, (sum(gathered_ups) / size)[start : start + rows[rank]])

    def reducescatter_grad(op: hvd.ReduceOp, pre: float, post: float) -> Callable[[], None]:
        def run() -> None:
            # Horovod: allgather(grad * (size if Sum) * prescale * postscale).
            x = torch.ones(4, 2, requires_grad=True)
            part_ups = [upstream_of(r, (2, 2)) for r in range(size)]
            out = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post)
            got = grad_of(x, out, part_ups[rank])
            factor = (size if op == hvd.Sum else 1) * pre * post
            same(f"reducescatter {op.name} grad", got, torch.cat(part_ups) * factor)

        return run

    def grouped_allreduce_grad() -> None:
        xs = [torch.ones(3, 2, requires_grad=True), torch.ones(4, requires_grad=True)]
        outs = hvd.grouped_allreduce(xs, op=hvd.Sum, prescale_factor=0.5)
        upstream = [ups[rank], torch.arange(4.0) * (rank + 1)]
        sum(((o * u).sum() for o, u in zip(outs, upstream)), torch.zeros(())).backward()
        same("grouped_allreduce grad 0", xs[0].grad, sum(ups) * 0.5)
        same("grouped_allreduce grad 1", xs[1].grad, torch.arange(4.0) * 3 * 0.5)

    def grouped_allgather_grad() -> None:
        xs = [torch.ones(rank + 1, 2, requires_grad=True), torch.ones(2, requires_grad=True)]
        outs = hvd.grouped_allgather(xs)
        upstream = [upstream_of(rank, (3, 2)), torch.arange(4.0) + rank]
        sum(((o * u).sum() for o, u in zip(outs, upstream)), torch.zeros(())).backward()
        start = 0 if rank == 0 else 1
        mean0 = sum(upstream_of(r, (3, 2)) for r in range(size)) / size
        same("grouped_allgather grad 0", xs[0].grad, mean0[start : start + rank + 1])
        mean1 = sum(torch.arange(4.0) + r for r in range(size)) / size
        same("grouped_allgather grad 1", xs[1].grad, mean1[2 * rank : 2 * rank + 2])

    def grouped_reducescatter_grad() -> None:
        xs = [torch.ones(4, 2, requires_grad=True), torch.ones(2, requires_grad=True)]
        outs = hvd.grouped_reducescatter(xs, op=hvd.Average, postscale_factor=2.0)
        part_ups = [[upstream_of(r, (2, 2)), torch.tensor([5.0 + r])] for r in range(size)]
        sum(((o * u).sum() for o, u in zip(outs, part_ups[rank])), torch.zeros(())).backward()
        same("grouped_reducescatter grad 0", xs[0].grad, torch.cat([u[0] for u in part_ups]) * 2)
        same("grouped_reducescatter grad 1", xs[1].grad, torch.cat([u[1] for u in part_ups]) * 2)

    check("grad/broadcast-average", broadcast_grad)
    check("grad/allgather-average", allgather_grad)
    check("grad/reducescatter-sum", reducescatter_grad(hvd.Sum, 1.0, 1.0))
    check("grad/reducescatter-average", reducescatter_grad(hvd.Average, 1.0, 1.0))
    check("grad/reducescatter-sum-scaled", reducescatter_grad(hvd.Sum, 0.5, 3.0))
    check("grad/grouped_allreduce", grouped_allreduce_grad)
    check("grad/grouped_allgather", grouped_allgather_grad)
    check("grad/grouped_reducescatter", grouped_reducescatter_grad)


# --- scaling, bit for bit ---------------------------------------------------------------------

NP_DTYPES = {
    torch.uint8: np.uint8,
    torch.int8: np.int8,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.float16: np.float16,
    torch.float32: np.float32,
    torch.float64: np.float64,
}


def horovod_scale(a: np.ndarray, factor: float) -> np.ndarray:
    """``ScaleBufferCPUImpl`` (``horovod/common/ops/collective_operations.h``): integers
    multiplied in double and converted back (truncation toward zero), float64 in double,
    float32 by ``(float)factor`` in float, float16 widened to float, multiplied by
    ``(float)factor`` and rounded to nearest even."""
    if factor == 1.0:
        return a
    if a.dtype == np.float64:
        return a * np.float64(factor)
    if a.dtype == np.float32:
        return np.float32(factor) * a
    if a.dtype == np.float16:
        return (np.float32(factor) * a.astype(np.float32)).astype(np.float16)
    return np.trunc(a.astype(np.float64) * factor).astype(a.dtype)


def horovod_sum(arrays: list[np.ndarray]) -> np.ndarray:
    """The sum over ranks: integers wrap, float16 adds in float32 and rounds."""
    if arrays[0].dtype == np.float16:
        wide = [a.astype(np.float32) for a in arrays]
        return sum(wide[1:], wide[0]).astype(np.float16)
    with np.errstate(over="ignore"):
        return np.sum(np.stack(arrays), axis=0, dtype=arrays[0].dtype)


def horovod_reduce(
    arrays: list[np.ndarray], op: hvd.ReduceOp, pre: float, post: float
) -> np.ndarray:
    """Horovod's allreduce on CPU: prescale, sum, then postscale with ``post / size`` for
    Average (``GlooAllreduce::Execute``: ``postscale_factor /= size``)."""
    factor = post / len(arrays) if op == hvd.Average else post
    return horovod_scale(horovod_sum([horovod_scale(a, pre) for a in arrays]), factor)


def inputs_of(dtype: torch.dtype, rank: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(1000 + rank)
    np_dtype = NP_DTYPES[dtype]
    if np.issubdtype(np_dtype, np.integer):
        info = np.iinfo(np_dtype)
        # Small enough that no scaled value or sum leaves the type (C++ leaves that undefined).
        low, high = max(info.min // 16, -(2**40)), min(info.max // 16, 2**40)
        return rng.integers(low, high, size=n, dtype=np.int64).astype(np_dtype)
    if np_dtype == np.float16:
        return (rng.standard_normal(n) * 50).astype(np.float16)
    return (rng.standard_normal(n) * 1000).astype(np_dtype)


def check_scaling(rank: int, size: int) -> None:
    factors = [(0.7, 1.3), (1.0, 0.1), (1.0 / 3.0, 3.0), (2.5, 1.0)]
    n = 4096
    for dtype in NP_DTYPES:
        arrays = [inputs_of(dtype, r, n) for r in range(size)]
        for op in (hvd.Sum, hvd.Average):
            for pre, post in factors:
                label = f"{str(dtype)[6:]}/{op.name}/{pre:.3g}/{post:.3g}"

                def allreduce_bits(pre=pre, post=post, op=op, label=label, arrays=arrays) -> None:
                    got = hvd.allreduce(
                        torch.from_numpy(arrays[rank].copy()),
                        op=op,
                        prescale_factor=pre,
                        postscale_factor=post,
                        name=f"scale/{label}",
                    )
                    want = torch.from_numpy(horovod_reduce(arrays, op, pre, post))
                    differ = int((got.view(-1).numpy() != want.view(-1).numpy()).sum())
                    if differ:
                        raise AssertionError(f"{differ} of {n} elements differ from Horovod's")

                check(f"scale/allreduce/{label}", allreduce_bits)
        pre, post = 0.7, 1.3

        def reducescatter_bits(dtype=dtype, arrays=arrays, pre=pre, post=post) -> None:
            got = hvd.reducescatter(
                torch.from_numpy(arrays[rank].copy()),
                op=hvd.Average,
                prescale_factor=pre,
                postscale_factor=post,
                name=f"scale/rs/{dtype}",
            )
            full = horovod_reduce(arrays, hvd.Average, pre, post)
            want = torch.from_numpy(full[rank * n // size : (rank + 1) * n // size].copy())
            if not np.array_equal(got.numpy().view(np.uint8), want.numpy().view(np.uint8)):
                raise AssertionError("reducescatter differs from Horovod's scaling")

        check(f"scale/reducescatter/{str(dtype)[6:]}", reducescatter_bits)


# --- join with allgather and broadcast --------------------------------------------------------


def check_join(rank: int, size: int) -> None:
    """Horovod's test_horovod_join_allgather / _broadcast: the ranks still calling allgather or
    broadcast while one has joined get a RuntimeError, then join; join returns the last rank
    to join, the same everywhere."""
    tensor = torch.ones(17, 17)
    for kind in ("allgather", "broadcast"):
        for first in range(size):

            def run(kind=kind, first=first) -> None:
                if rank == first:
                    last = hvd.join()
                else:
                    try:
                        if kind == "allgather":
                            hvd.allgather(tensor, name=f"join.{kind}.{first}")
                        else:
                            hvd.broadcast(tensor, rank, name=f"join.{kind}.{first}")
                    except RuntimeError as err:
                        if not isinstance(err, HorovodInternalError) or "joined" not in str(err):
                            raise AssertionError(
                                f"unexpected error {type(err).__name__}: {err}"
                            ) from err
                    else:
                        raise AssertionError(f"hvd.{kind} did not throw error")
                    last = hvd.join()
                if last == first:
                    raise AssertionError(f"join() returned the first rank to join ({first})")
                everyone = hvd.allgather_object(last)
                if everyone != [last] * size:
                    raise AssertionError(f"join() returned {everyone} on the ranks")

            check(f"join/{kind}/first-{first}", run)
    check("join/allreduce-still-runs", lambda: check_join_allreduce(rank))


def check_join_allreduce(rank: int) -> None:
    if rank == 0:
        last = hvd.join()
    else:
        total = hvd.allreduce(torch.full((3,), 2.0), op=hvd.Sum, name="join.allreduce")
        same("allreduce with a joined rank", total, torch.full((3,), 2.0))
        last = hvd.join()
    if last != 1:
        raise AssertionError(f"join() returned {last}, rank 1 joined last")


# --- broadcast_optimizer_state before any gradient --------------------------------------------


class Net(torch.nn.Module):
    def __init__(self, sparse: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(6, 3, sparse=sparse)
        self.linear = torch.nn.Linear(3, 2)
        self.unused = torch.nn.Linear(2, 2)  # never gets a gradient

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.linear(self.embed(idx))


def snapshot(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def state_of(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[dict]:
    return [
        {k: (v.clone() if torch.is_tensor(v) else v) for k, v in optimizer.state.get(p, {}).items()}
        for p in model.parameters()
    ]


def check_optimizer_state(rank: int, size: int) -> None:
    def adam_root_stepped_others_fresh() -> None:
        torch.manual_seed(rank)
        model = Net(sparse=False)
        adam = torch.optim.Adam(model.parameters(), lr=0.1, betas=(0.8, 0.9))
        if rank == 0:  # the root trained a step; the unused layer has no gradient and no state
            model(torch.tensor([1, 2])).sum().backward()
            adam.step()
            adam.zero_grad(set_to_none=True)
            adam.param_groups[0]["lr"] = 0.05
        before = snapshot(model)
        hvd.broadcast_optimizer_state(adam, root_rank=0, model=model)
        for mine, was in zip(snapshot(model), before):
            same("parameters unchanged", mine, was)
        if rank != 0 and any(
            not torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters()
        ):
            raise AssertionError("a parameter without a gradient did not get a zero one")
        mine = state_of(adam, model)
        everyone = hvd.allgather_object(mine)
        for r, theirs in enumerate(everyone):
            for i, (a, b) in enumerate(zip(everyone[0], theirs)):
                if a.keys() != b.keys() or any(
                    not torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a
                ):
                    raise AssertionError(f"rank {r}'s state of parameter {i} differs from rank 0")
        if mine[-1] or mine[-2]:
            raise AssertionError("the unused layer got state the root does not have")
        if adam.param_groups[0]["lr"] != 0.05:
            raise AssertionError(f"lr is {adam.param_groups[0]['lr']}, rank 0 set 0.05")

    def sgd_all_fresh(sparse: bool, momentum: float) -> Callable[[], None]:
        def run() -> None:
            # No rank stepped yet: the state is created by a step with zero gradients (sparse
            # ones for the sparse embedding, which model= names), the parameters stay as they
            # were, and every rank ends with the same state.
            torch.manual_seed(10 + rank)
            model = Net(sparse=sparse)
            sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
            before = snapshot(model)
            hvd.broadcast_optimizer_state(sgd, 0, model)  # Horovod's positional model
            for mine, was in zip(snapshot(model), before):
                same("parameters unchanged", mine, was)
            states = hvd.allgather_object(state_of(sgd, model))
            if states[0].__repr__() != states[-1].__repr__():
                raise AssertionError(f"the state differs across ranks: {states}")
            model(torch.tensor([0, rank])).sum().backward()  # the optimizer still steps
            sgd.step()

        return run

    check("optimizer_state/adam-no-grads-yet", adam_root_stepped_others_fresh)
    check("optimizer_state/sgd-momentum-model", sgd_all_fresh(False, 0.9))
    check("optimizer_state/sgd-sparse-embedding-model", sgd_all_fresh(True, 0.0))


# --- sparse_allreduce_async -------------------------------------------------------------------


def check_sparse(rank: int, size: int) -> None:
    def run(op: hvd.ReduceOp) -> None:
        # Rank r has entries at rows r and 3 (the latter shared): 2 entries each, uncoalesced.
        indices = torch.tensor([[rank, 3], [0, 1]])
        values = torch.tensor([1.0 + rank, 10.0 * (rank + 1)])
        grad = torch.sparse_coo_tensor(indices, values, (4, 2))
        handle = hvd.sparse_allreduce_async(grad, name=f"sparse.{op.name}", op=op)
        result = handle() if op == hvd.Sum else hvd.synchronize(handle)
        if not result.is_sparse or result._nnz() != 2 * size:
            raise AssertionError(f"expected {2 * size} gathered entries, got {result}")
        want = sum(
            torch.sparse_coo_tensor(
                torch.tensor([[r, 3], [0, 1]]), torch.tensor([1.0 + r, 10.0 * (r + 1)]), (4, 2)
            ).to_dense()
            for r in range(size)
        )
        same(f"sparse {op.name}", result.to_dense(), want / size if op == hvd.Average else want)

    check("sparse_allreduce_async/sum", lambda: run(hvd.Sum))
    check("sparse_allreduce_async/average", lambda: run(hvd.Average))


# --- exceptions -------------------------------------------------------------------------------


def check_exceptions(rank: int) -> None:
    def mismatch_is_runtime_error() -> None:
        try:
            hvd.allreduce(torch.ones(3 + rank), name="mismatch.runtime")
        except RuntimeError as err:
            print(f"mismatch raised {type(err).__name__} (a RuntimeError)", flush=True)
        else:
            raise AssertionError("no error for a shape mismatch")

    def mismatch_is_horovod_internal_error() -> None:
        try:
            dtype = torch.float32 if rank else torch.float64
            hvd.allreduce(torch.ones(3, dtype=dtype), name="mismatch.dtype")
        except HorovodInternalError as err:
            print(f"mismatch raised {type(err).__name__} (a HorovodInternalError)", flush=True)
        else:
            raise AssertionError("no error for a dtype mismatch")

    def float_splits_are_a_value_error() -> None:
        # Horovod's test_horovod_alltoall_splits_type_error: uninitialized float splits must
        # raise on every rank, whatever their values.
        try:
            hvd.alltoall(torch.empty(2), torch.zeros(2, dtype=torch.float32))
        except ValueError as err:
            print(f"float splits raised {type(err).__name__} (a ValueError)", flush=True)
        else:
            raise AssertionError("no error for float splits")

    check("exceptions/alltoall-float-splits", float_splits_are_a_value_error)
    check("exceptions/mismatch-runtime-error", mismatch_is_runtime_error)
    check("exceptions/mismatch-horovod-internal-error", mismatch_is_horovod_internal_error)


def kill_peer(rank: int) -> int:
    hvd.barrier()
    if rank == 1:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    start = time.time()
    try:
        while time.time() - start < 60:
            hvd.allreduce(torch.ones(1 << 18), op=hvd.Sum)
    except RuntimeError as err:
        print(
            f"killed peer: {type(err).__name__} runtime=True "
            f"horovod_internal={isinstance(err, HorovodInternalError)}",
            flush=True,
        )
        return 0
    print("killed peer: no error within 60 s", flush=True)
    return 1


def main() -> int:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if sys.argv[1:] == ["kill"]:
        return kill_peer(rank)
    check_gradients(rank, size)
    check_scaling(rank, size)
    check_join(rank, size)
    check_optimizer_state(rank, size)
    check_sparse(rank, size)
    check_exceptions(rank)
    print(f"rank {rank}: {checked} checks, {len(failures)} failures: {failures}", flush=True)
    hvd.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
