"""Trains small models with kolo.torch's training API and checks them against one process.

Run under ``kolorun -np 2`` with scenario names as arguments. Every rank also computes the
single-process reference itself (same seed, the concatenated batch), compares, and prints
``rank R: <scenario> ok (...)``; any difference raises and the rank exits non-zero.
"""

from __future__ import annotations

import sys
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

import kolo.torch as hvd
from kolo import _native
from kolo.exceptions import MismatchError

B = 8  # rows per rank and step
STEPS = 20
LR = 0.1
MOMENTUM = 0.9
torch.set_default_dtype(torch.float64)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.unused = torch.nn.Linear(2, 2)  # never in the forward pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def make_model(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def dataset(steps: int = STEPS) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` global batches of ``size * B`` rows; rank r trains on rows [r*B, (r+1)*B)."""
    g = torch.Generator().manual_seed(1234)
    rows = hvd.size() * B
    return torch.randn(steps, rows, 4, generator=g), torch.randn(steps, rows, 3, generator=g)


def my_rows(t: torch.Tensor) -> torch.Tensor:
    r = hvd.rank()
    return t[r * B : (r + 1) * B]


def sgd(model: torch.nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def reference(
    steps: int,
    grad_of_step: Callable[[torch.nn.Module, int], None],
    after_backward: Callable[[torch.nn.Module], None] = lambda m: None,
) -> Net:
    """One process: SGD with momentum where ``grad_of_step`` fills the gradients of a step."""
    model = make_model()
    opt = sgd(model)
    for step in range(steps):
        opt.zero_grad()
        grad_of_step(model, step)
        after_backward(model)
        opt.step()
    return model


def full_batch_grad(X: torch.Tensor, Y: torch.Tensor, scale: float = 1.0):
    def fill(model: torch.nn.Module, step: int) -> None:
        (F.mse_loss(model(X[step]), Y[step]) * scale).backward()

    return fill


def max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(
        (pa.detach() - pb.detach()).abs().max().item()
        for pa, pb in zip(a.parameters(), b.parameters())
    )


def expect(label: str, diff: float, tol: float, at_least: float = 0.0) -> str:
    if not (at_least <= diff <= tol):
        raise AssertionError(
            f"rank {hvd.rank()}: {label}: max |difference| {diff:.3e} not in [{at_least}, {tol}]"
        )
    return f"{label} {diff:.1e}"


def train_distributed(opt_kwargs: dict, steps: int = STEPS, loss_scale: float = 1.0) -> Net:
    X, Y = dataset(steps)
    model = make_model()
    opt = hvd.DistributedOptimizer(
        sgd(model), named_parameters=model.named_parameters(), **opt_kwargs
    )
    for step in range(steps):
        opt.zero_grad()
        (F.mse_loss(model(my_rows(X[step])), my_rows(Y[step])) * loss_scale).backward()
        opt.step()
        if step == 0:
            # The unused layer got no gradient here, but synchronize() reduced zeros for it.
            assert model.unused.weight.grad is not None, "unused parameter was not reduced"
            assert model.unused.weight.grad.abs().max().item() == 0.0
    return model


# --- scenarios --------------------------------------------------------------------------------


def scenario_average() -> str:
    X, Y = dataset()
    model = make_model()
    base = sgd(model)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD", type(opt).__mro__
    assert opt.param_groups[0]["lr"] == LR and opt.param_groups[0]["momentum"] == MOMENTUM
    for step in range(STEPS):
        opt.zero_grad()
        F.mse_loss(model(my_rows(X[step])), my_rows(Y[step])).backward()
        opt.step()
    ref = reference(STEPS, full_batch_grad(X, Y))
    # The wrapper's state_dict holds the momentum buffers; loading it round-trips.
    state = opt.state_dict()
    assert len(state["state"]) == 6 and "momentum_buffer" in state["state"][0]
    opt.load_state_dict(state)
    own = expect("average", max_diff(model, ref), 1e-9)
    alone = reference(STEPS, full_batch_grad(my_rows_all(X), my_rows_all(Y)))
    # Without the allreduce this rank would have trained on its half only: far from ref.
    expect("local-only differs", max_diff(alone, ref), 10.0, at_least=1e-3)
    return own


def my_rows_all(t: torch.Tensor) -> torch.Tensor:
    r = hvd.rank()
    return t[:, r * B : (r + 1) * B]


def scenario_predivide() -> str:
    X, Y = dataset()
    model = train_distributed({"gradient_predivide_factor": 4.0})
    return expect("predivide", max_diff(model, reference(STEPS, full_batch_grad(X, Y))), 1e-9)


def scenario_sum() -> str:
    X, Y = dataset()
    model = train_distributed({"op": hvd.Sum})
    # Sum of the ranks' mean-gradients == size * the full batch's mean-gradient.
    ref = reference(STEPS, full_batch_grad(X, Y, scale=float(hvd.size())))
    return expect("sum", max_diff(model, ref), 1e-9)


def scenario_errors() -> str:
    model = make_model()
    named = list(model.named_parameters())
    duplicated = [("same", p) for _, p in named]
    for label, kwargs, error in [
        ("duplicate names", {"named_parameters": duplicated}, ValueError),
        ("not tuples", {"named_parameters": [p for _, p in named]}, ValueError),
        ("unnamed parameter", {"named_parameters": named[:2]}, ValueError),
        ("adasum with predivide", {"op": hvd.Adasum, "gradient_predivide_factor": 2.0}, ValueError),
        ("predivide with sum", {"op": hvd.Sum, "gradient_predivide_factor": 2.0}, ValueError),
        ("groups zero", {"groups": 0}, ValueError),
        ("groups repeated", {"groups": [[named[0][1]], [named[0][1]]]}, ValueError),
        ("passes zero", {"backward_passes_per_step": 0}, ValueError),
    ]:
        try:
            hvd.DistributedOptimizer(sgd(model), **kwargs)
        except error:
            continue
        raise AssertionError(f"{label}: DistributedOptimizer did not raise {error.__name__}")
    return "errors 8 raised"


class OddNet(Net):
    """Net plus a parameter whose shape differs between the ranks: its reduction fails."""

    def __init__(self) -> None:
        super().__init__()
        self.odd = torch.nn.Parameter(torch.zeros(1 + hvd.rank()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + self.odd.sum()


def scenario_failed_reduction() -> str:
    # One gradient's reduction fails (its shape differs between the ranks): synchronize()
    # raises MismatchError only once every other reduction is over (each averaged, none left
    # holding its gradient in the engine), and the next step pairs every tensor right.
    X, Y = dataset(2)
    torch.manual_seed(0)
    model = OddNet()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    opt.zero_grad()
    F.mse_loss(model(my_rows(X[0])), my_rows(Y[0])).backward()
    started = [pending.handle for pending in opt._pending.values()]
    assert len(started) == 5, f"the hooks started {len(started)} reductions, not 5"
    # A gradient replaced after its hook fired still receives the average (as the one
    # synchronize() writes back into).
    replaced = model.fc1.bias.grad
    model.fc1.bias.grad = replaced.clone()
    try:
        opt.synchronize()
    except MismatchError as err:
        assert "odd" in str(err), err
    else:
        raise AssertionError("synchronize() did not raise MismatchError for allreduce.odd")
    held = [h for h in started if isinstance(h, int) and _native.holds(h)]
    assert not held, f"handles {held} still hold their gradients after synchronize() raised"
    ref = make_model()
    ref.zero_grad()
    F.mse_loss(ref(X[0]), Y[0]).backward()
    checks = [("fc1.bias replaced", model.fc1.bias.grad, ref.fc1.bias.grad)]
    want = dict(ref.named_parameters())
    checks += [(n, p.grad, want[n].grad) for n, p in model.named_parameters() if n[:2] == "fc"]
    for label, got, want in checks:
        expect(f"failed_reduction {label}", (got - want).abs().max().item(), 1e-12)
    # The job goes on: a consistent model's step averages every gradient.
    opt.zero_grad()
    model.odd.data = torch.zeros(1)
    F.mse_loss(model(my_rows(X[1])), my_rows(Y[1])).backward()
    opt.synchronize()
    gathered_equal("failed_reduction next step", [p.grad for p in model.parameters()])
    return f"MismatchError after {len(started) - 1} reductions averaged"


def scenario_groups_int() -> str:
    X, Y = dataset()
    model = train_distributed({"groups": 2})
    return expect("groups=2", max_diff(model, reference(STEPS, full_batch_grad(X, Y))), 1e-9)


def scenario_groups_list() -> str:
    X, Y = dataset()
    model = make_model()
    groups = [[model.fc1.weight, model.fc2.weight], [model.fc1.bias, model.unused.bias]]
    opt = hvd.DistributedOptimizer(
        sgd(model), named_parameters=model.named_parameters(), groups=groups
    )
    for step in range(STEPS):
        opt.zero_grad()
        F.mse_loss(model(my_rows(X[step])), my_rows(Y[step])).backward()
        opt.step()
    ref = reference(STEPS, full_batch_grad(X, Y))
    return expect("groups=list", max_diff(model, ref), 1e-9)


class EmbeddingNet(torch.nn.Module):
    def __init__(self, sparse: bool) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.emb = torch.nn.Embedding(10, 3, sparse=sparse)
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(ids).sum(1))


def sparse_run(sparse_as_dense: bool) -> str:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 10, (STEPS, hvd.size() * B, 2), generator=g)
    y = torch.randn(STEPS, hvd.size() * B, 1, generator=g)
    model = EmbeddingNet(sparse=True)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR),
        named_parameters=model.named_parameters(),
        sparse_as_dense=sparse_as_dense,
    )
    for step in range(STEPS):
        opt.zero_grad()
        F.mse_loss(model(my_rows(ids[step])), my_rows(y[step])).backward()
        assert model.emb.weight.grad.is_sparse
        opt.step()
        assert model.emb.weight.grad.is_sparse  # written back as sparse
    ref = EmbeddingNet(sparse=False)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for step in range(STEPS):
        ref_opt.zero_grad()
        F.mse_loss(ref(ids[step]), y[step]).backward()
        ref_opt.step()
    label = "sparse_as_dense" if sparse_as_dense else "sparse"
    return expect(label, max_diff(model, ref), 1e-9)


def scenario_sparse() -> str:
    return sparse_run(sparse_as_dense=False)


def scenario_sparse_as_dense() -> str:
    return sparse_run(sparse_as_dense=True)


def scenario_clip() -> str:
    X, Y = dataset()
    max_norm = 0.05
    model = make_model()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(STEPS):
            opt.zero_grad()
            F.mse_loss(model(my_rows(X[step])), my_rows(Y[step])).backward()
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            with opt.skip_synchronize():
                opt.step()
    assert not [w for w in caught if "skip_synchronize" in str(w.message)], caught

    norms: list[float] = []

    def clip(m: torch.nn.Module) -> None:
        norms.append(float(torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm)))

    ref = reference(STEPS, full_batch_grad(X, Y), after_backward=clip)
    assert max(norms) > 2 * max_norm, f"clipping never engaged: {norms}"
    result = expect("clip", max_diff(model, ref), 1e-9)

    # zero_grad() while reductions are outstanding is refused; step() then completes them.
    opt.zero_grad()
    F.mse_loss(model(my_rows(X[0])), my_rows(Y[0])).backward()
    try:
        opt.zero_grad()
    except AssertionError:
        pass
    else:
        raise AssertionError("zero_grad() with outstanding allreduces did not raise")
    opt.step()
    # step() right after synchronize() (without skip_synchronize) warns, as in Horovod.
    opt.zero_grad()
    F.mse_loss(model(my_rows(X[1])), my_rows(Y[1])).backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    assert any("skip_synchronize" in str(w.message) for w in caught), caught
    return result


def scenario_accumulate() -> str:
    X, Y = dataset()
    half = B // 2
    model = make_model()
    opt = hvd.DistributedOptimizer(
        sgd(model), named_parameters=model.named_parameters(), backward_passes_per_step=2
    )
    for step in range(STEPS):
        opt.zero_grad()
        x, y = my_rows(X[step]), my_rows(Y[step])
        for micro in range(2):
            rows = slice(micro * half, (micro + 1) * half)
            # Horovod sums the accumulated passes; scale each micro-batch loss by 1/passes to
            # get the mean over the rank's B rows (as Horovod's examples do).
            (F.mse_loss(model(x[rows]), y[rows]) / 2).backward()
            if micro == 0:
                # After one of two passes nothing has been reduced yet: this rank's partial sum.
                assert not opt._pending, "reduction started before backward_passes_per_step"
        opt.step()
    # Equivalent: the mean over each rank's 2 micro-batches of B/2, averaged over ranks ==
    # the mean over the 2B-row global batch.
    result = expect("accumulate", max_diff(model, reference(STEPS, full_batch_grad(X, Y))), 1e-9)

    # A third backward pass before step() is refused.
    opt.zero_grad()
    try:
        for _ in range(3):
            F.mse_loss(model(my_rows(X[0])), my_rows(Y[0])).backward()
    except AssertionError as err:
        assert "backward_passes_per_step" in str(err), err
    else:
        raise AssertionError("a third backward pass before step() did not raise")
    opt.synchronize()
    return result


def scenario_fp16() -> str:
    X, Y = dataset()
    model = train_distributed({"compression": hvd.Compression.fp16})
    # Rounding to float16 on the wire leaves a visible but small difference.
    diff = max_diff(model, reference(STEPS, full_batch_grad(X, Y)))
    return expect("fp16", diff, 1e-2, at_least=1e-7)


def scenario_bf16() -> str:
    X, Y = dataset()
    model = train_distributed({"compression": hvd.Compression.bf16})
    diff = max_diff(model, reference(STEPS, full_batch_grad(X, Y)))
    return expect("bf16", diff, 5e-2, at_least=1e-7)


def scenario_join() -> str:
    X, Y = dataset()
    my_steps = STEPS if hvd.rank() == 0 else STEPS - 5  # rank 1 runs out of data first
    model = make_model()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    for step in range(my_steps):
        opt.zero_grad()
        F.mse_loss(model(my_rows(X[step])), my_rows(Y[step])).backward()
        opt.step()
    last = hvd.join()
    if last != 0:
        raise AssertionError(f"join() returned {last}, but rank 0 joined last")

    def grad(model: torch.nn.Module, step: int) -> None:
        if step < STEPS - 5:
            F.mse_loss(model(X[step]), Y[step]).backward()
        else:
            # Rank 1 has joined: it contributes zeros and Average still divides by 2.
            (F.mse_loss(model(X[step, :B]), Y[step, :B]) / hvd.size()).backward()

    result = expect("join", max_diff(model, reference(my_steps, grad)), 1e-9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    expect("join+broadcast", max_diff(model, reference(STEPS, grad)), 1e-9)
    return result


def gathered_equal(label: str, tensors: list[torch.Tensor]) -> None:
    everyone = hvd.allgather_object([t.detach().clone() for t in tensors])
    for r, theirs in enumerate(everyone):
        for mine, other in zip(everyone[0], theirs):
            if not torch.equal(mine, other):
                raise AssertionError(f"{label}: rank {r} differs from rank 0")


def scenario_broadcast() -> str:
    rank = hvd.rank()
    X, Y = dataset(2)
    # Different weights, learning rates and momentum buffers on every rank.
    model = make_model(seed=rank)
    opt = torch.optim.SGD(model.parameters(), lr=LR * (rank + 1), momentum=MOMENTUM)
    for step in range(2):
        opt.zero_grad()
        F.mse_loss(model(my_rows(X[step])), my_rows(Y[step])).backward()
        opt.step()
    root_params = [p.detach().clone() for p in model.parameters()]
    root_buffers = [opt.state[p]["momentum_buffer"].clone() for p in model.fc1.parameters()]
    gathered = hvd.allgather_object([p.detach() for p in model.parameters()])
    assert not torch.equal(gathered[0][0], gathered[1][0]), "ranks started equal"
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    gathered_equal("sgd params", list(model.parameters()))
    gathered_equal(
        "sgd momentum", [opt.state[p]["momentum_buffer"] for p in model.fc1.parameters()]
    )
    assert opt.param_groups[0]["lr"] == LR, opt.param_groups[0]["lr"]
    if rank == 0:
        assert all(torch.equal(a, b) for a, b in zip(root_params, model.parameters()))
        assert all(
            torch.equal(a, opt.state[p]["momentum_buffer"])
            for a, p in zip(root_buffers, model.fc1.parameters())
        )

    # A fresh Adam (no state yet) with weight decay: state is created by a zero-gradient step
    # that must not move the weights; then rank 0's state wins.
    model = make_model(seed=rank)
    before = [p.detach().clone() for p in model.parameters()]
    adam = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=0.1)
    if rank == 0:
        for step in range(2):
            adam.zero_grad()
            F.mse_loss(model(my_rows(X[step])), my_rows(Y[step])).backward()
            adam.step()
        before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(adam, root_rank=0)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "weights moved"
    # Parameters that had no gradient keep the zero one the step used, as in Horovod.
    assert rank == 0 or all(not p.grad.any() for p in model.parameters())
    # Rank 0 never had state for the unused layer; afterwards no rank has.
    assert not adam.state.get(model.unused.weight), adam.state.get(model.unused.weight)
    trained = [*model.fc1.parameters(), *model.fc2.parameters()]
    adam_state = [adam.state[p][k] for p in trained for k in ("exp_avg", "exp_avg_sq")]
    gathered_equal("adam state", [*adam_state, adam.state[model.fc1.weight]["step"]])
    assert float(adam.state[model.fc1.weight]["step"]) == 2.0

    # Wrapped in DistributedOptimizer, with named_parameters() (a generator) to broadcast.
    model = make_model(seed=rank)
    dist = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.named_parameters(), root_rank=0)
    hvd.broadcast_optimizer_state(dist, root_rank=0)
    gathered_equal("named params", list(model.parameters()))
    assert "momentum_buffer" in dist.state[model.fc1.weight]

    # Objects.
    obj = hvd.broadcast_object({"epoch": 3} if rank == 0 else None, root_rank=0)
    assert obj == {"epoch": 3}, obj
    assert hvd.allgather_object(rank * 10) == [10 * r for r in range(hvd.size())]
    return "broadcast equal"


def scenario_syncbn() -> str:
    rank = hvd.rank()
    g = torch.Generator().manual_seed(99)
    checks = []
    # Uneven batches: rank 0 has 3 rows, rank 1 has 5.
    bounds = [(0, 3), (3, 8)]
    lo, hi = bounds[rank]
    for label, shape, reference_cls, momentum in [
        ("1d", (8, 4), torch.nn.BatchNorm1d, 0.1),
        ("1d-cma", (8, 4), torch.nn.BatchNorm1d, None),
        ("2d", (8, 3, 5, 5), torch.nn.BatchNorm2d, 0.3),
    ]:
        channels = shape[1]
        sync = hvd.SyncBatchNorm(channels, momentum=momentum)
        ref = reference_cls(channels, momentum=momentum)
        with torch.no_grad():
            weight = torch.rand(channels, generator=g) + 0.5
            bias = torch.randn(channels, generator=g)
            for m in (sync, ref):
                m.weight.copy_(weight)
                m.bias.copy_(bias)
        for _ in range(2):
            x_full = torch.randn(*shape, generator=g) * 3 + 1
            w_full = torch.randn(*shape, generator=g)
            x = x_full[lo:hi].clone().requires_grad_()
            xr = x_full.clone().requires_grad_()
            sync.zero_grad()
            ref.zero_grad()
            out = sync(x)
            out_ref = ref(xr)
            (out * w_full[lo:hi]).sum().backward()
            (out_ref * w_full).sum().backward()
            checks.append((f"{label} forward", (out - out_ref[lo:hi]).abs().max().item()))
            checks.append((f"{label} input grad", (x.grad - xr.grad[lo:hi]).abs().max().item()))
            for name in ("weight", "bias"):
                total = hvd.allreduce(getattr(sync, name).grad, op=hvd.Sum)
                diff = (total - getattr(ref, name).grad).abs().max().item()
                checks.append((f"{label} {name} grad", diff))
            for name in ("running_mean", "running_var"):
                diff = (getattr(sync, name) - getattr(ref, name)).abs().max().item()
                checks.append((f"{label} {name}", diff))
        sync.eval()
        ref.eval()
        x_full = torch.randn(*shape, generator=g)
        diff = (sync(x_full[lo:hi]) - ref(x_full)[lo:hi]).abs().max().item()
        checks.append((f"{label} eval", diff))
    for label, diff in checks:
        expect(label, diff, 1e-10)
    return f"syncbn {len(checks)} checks, max {max(d for _, d in checks):.1e}"


def main() -> int:
    hvd.init()
    if hvd.size() != 2:
        raise SystemExit("run under kolorun -np 2")
    for name in sys.argv[1:]:
        detail = globals()[f"scenario_{name}"]()
        print(f"rank {hvd.rank()}: {name} ok ({detail})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
