"""Adasum (``op=hvd.Adasum``) end to end on any number of ranks; prints ``OK rank R``.

On a power-of-two job: allreduce, allreduce_, grouped_allreduce (a fused batch of tensors
whose boundaries the result must respect), an Adasum and a Sum started together (never
fused), the postscale factor, every float dtype at several sizes, integer refusal, a process
set of 2 (and, on 4 ranks, one of 3 refused on its members), the delta-style
DistributedOptimizer against its definition, and a small training task where Adasum reaches
the accuracy of Sum. Results are checked against a NumPy float64 reference of Horovod's
formula (its test's tree reduction). On another size every Adasum call raises
NotSupportedError (a NotImplementedError) on every rank and the job still runs collectives.
"""

import os

import numpy as np
import torch

import kolo
import kolo.torch as hvd
from kolo.exceptions import InvalidArgumentError, NotSupportedError

# Ranks share the machine's cores: torch's intra-op threads would only contend.
torch.set_num_threads(1)

SEED = 1234
#: Largest ||got - want|| / ||want|| accepted per dtype (each level rounds to the dtype).
TOLERANCE = {
    torch.float64: 1e-12,
    torch.float32: 2e-6,
    torch.float16: 4e-3,
    torch.bfloat16: 3e-2,
}


def adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Horovod's test reference (test_adasum_tensorflow.py), in float64."""
    dot = float(np.dot(a.ravel(), b.ravel()))
    anormsq = float(np.dot(a.ravel(), a.ravel()))
    bnormsq = float(np.dot(b.ravel(), b.ravel()))
    acoeff = 1.0 - dot / anormsq * 0.5 if anormsq != 0 else 1.0
    bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq != 0 else 1.0
    return acoeff * a + bcoeff * b


def as_f64(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to(torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


def tree(per_rank: list) -> np.ndarray:
    """Ranks combined pairwise: (0,1), (2,3), ..., then the pairs' results, and so on."""
    level = [as_f64(t) for t in per_rank]
    while len(level) > 1:
        level = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def inputs(size: int, n: int, dtype: torch.dtype, salt: int) -> list[torch.Tensor]:
    """Every rank's tensor (all ranks build all of them, for the reference)."""
    out = []
    for r in range(size):
        rng = np.random.default_rng([SEED, salt, r])
        # A shared component makes the ranks' vectors correlated (coefficients != 1).
        common = np.random.default_rng([SEED, salt]).normal(size=n)
        out.append(torch.from_numpy(common + rng.normal(size=n)).to(dtype))
    return out


def check_close(got: torch.Tensor, want: np.ndarray, dtype: torch.dtype, what: str) -> None:
    got64 = got.to(torch.float64).numpy()
    err = np.linalg.norm(got64 - want) / max(np.linalg.norm(want), 1e-300)
    assert err <= TOLERANCE[dtype], f"{what}: relative error {err:.3g} > {TOLERANCE[dtype]}"


def same_everywhere(t: torch.Tensor, what: str) -> None:
    """Asserts every rank holds bit-identical ``t``."""
    everyone = hvd.allgather(t.detach().reshape(1, -1).to(torch.float64), name=f"same.{what}")
    assert torch.equal(everyone, everyone[:1].expand_as(everyone)), f"{what} differs by rank"


def check_ops(r: int, n: int) -> None:
    salt = 0
    for dtype in TOLERANCE:
        for count in (1, 7, 1000, (1 << 14) + 3):
            salt += 1
            per_rank = inputs(n, count, dtype, salt)
            want = tree(per_rank)
            got = hvd.allreduce(per_rank[r], op=hvd.Adasum, name=f"a.{salt}")
            assert got.dtype == dtype
            check_close(got, want, dtype, f"allreduce {dtype} x{count}")
            same_everywhere(got, f"a.{salt}")
            t = per_rank[r].clone()
            hvd.allreduce_(t, op=hvd.Adasum, name=f"b.{salt}", postscale_factor=0.5)
            check_close(t, want * 0.5, dtype, f"allreduce_ postscale {dtype} x{count}")

    # A fused batch: one grouped call of float32 tensors of assorted sizes; each tensor gets
    # its own coefficients (treating the buffer as one vector would fail the reference).
    counts = [5, 130, 1, 64, 33, 900]
    per_tensor = [inputs(n, c, torch.float32, 100 + i) for i, c in enumerate(counts)]
    # Tensor 0 identical on every rank (Adasum averages it), tensor 1 anti-correlated.
    per_tensor[0] = [per_tensor[0][0].clone() for _ in range(n)]
    before = kolo.engine_stats()
    outs = hvd.grouped_allreduce([t[r] for t in per_tensor], op=hvd.Adasum, name="fused")
    after = kolo.engine_stats()
    # Fused collectives (the engine may split a batch across cycles), over TCP: Adasum never
    # uses shared memory.
    assert after["fused_tensors"] - before["fused_tensors"] >= 2, (before, after)
    assert after["shm_collectives"] == before["shm_collectives"], (before, after)
    for i, (out, ranks) in enumerate(zip(outs, per_tensor)):
        check_close(out, tree(ranks), torch.float32, f"grouped tensor {i}")
    assert torch.allclose(outs[0], per_tensor[0][0]), "identical tensors must average"
    whole = tree([torch.cat([t[q] for t in per_tensor]) for q in range(n)])
    assert not np.allclose(torch.cat(outs).double().numpy(), whole, rtol=1e-3), (
        "the fused batch was reduced as one vector"
    )

    # Adasum and Sum in the same cycle: the engine must keep them in separate responses.
    x = torch.full((64,), float(r + 1))
    y = inputs(n, 64, torch.float32, 999)
    h_sum = hvd.allreduce_async(x, op=hvd.Sum, name="mix.sum")
    h_ada = hvd.allreduce_async(y[r], op=hvd.Adasum, name="mix.adasum")
    assert torch.equal(hvd.synchronize(h_sum), torch.full((64,), float(n * (n + 1) // 2)))
    check_close(hvd.synchronize(h_ada), tree(y), torch.float32, "adasum next to sum")

    # Integer dtypes are refused at the call, on every rank.
    try:
        hvd.allreduce(torch.ones(4, dtype=torch.int32), op=hvd.Adasum, name="ints")
    except InvalidArgumentError as err:
        assert "Adasum" in str(err) and "int32" in str(err), err
    else:
        raise AssertionError("an int32 Adasum allreduce was accepted")
    # reducescatter has no Adasum: a RuntimeError, as Horovod's test expects.
    try:
        hvd.reducescatter(torch.ones(n, 2), op=hvd.Adasum, name="rs")
    except RuntimeError as err:
        assert "Adasum" in str(err), err
    else:
        raise AssertionError("reducescatter accepted Adasum")


def check_stability(r: int, n: int) -> None:
    """Horovod's test_stability and test_stability_2 (test_adasum_pytorch.py): every rank's
    vector is a multiple of one vector (so Adasum averages them), with values near the dtype's
    smallest normal, or magnitudes spread from the smallest to sqrt(largest) (their squares
    overflow float32: the norms must be accumulated in float64). Horovod's closeness rule."""
    for dtype, np_dtype in ((torch.float16, np.float16), (torch.float32, np.float32)):
        info = np.finfo(np_dtype)
        rng = np.random.default_rng(2)
        a = rng.normal(0, float(info.tiny), (1024, 1))
        scales = rng.normal(0, 1, (n, 1))
        lo, hi = float(info.tiny), float(np.sqrt(float(info.max)))
        spread = np.array([[hi ** ((i + 1) / n) * lo ** ((n - i - 1) / n)] for i in range(n)])
        rng.shuffle(spread)
        b = rng.normal(0, 1, (1024, 1))
        for case, q in (("tiny", a @ scales.T), ("spread", b @ spread.T)):
            q = q.astype(np_dtype).astype(np.float64)
            t = torch.from_numpy(q[:, r].copy()).to(dtype)
            hvd.allreduce_(t, op=hvd.Adasum, name=f"stability.{case}.{np_dtype.__name__}")
            want = q.sum(axis=1) / n
            ratio = np.linalg.norm(want - t.double().numpy()) / np.linalg.norm(want) / 100.0
            assert ratio < info.eps, f"stability {case} {dtype}: {ratio} >= {info.eps}"


def check_process_sets(r: int, n: int, pair: kolo.ProcessSet, three: kolo.ProcessSet) -> None:
    if pair.included():
        ranks = inputs(2, 300, torch.float64, 500)
        got = hvd.allreduce(ranks[pair.rank()], op=hvd.Adasum, process_set=pair, name="ps2")
        check_close(got, tree(ranks), torch.float64, "process set of 2")
    if three.included():
        try:
            hvd.allreduce(torch.ones(3), op=hvd.Adasum, process_set=three, name="ps3")
        except NotSupportedError as err:
            assert "non-power of 2" in str(err) and "3 ranks" in str(err), err
        else:
            raise AssertionError("Adasum on a process set of 3 was accepted")


def check_optimizer_definition(r: int, n: int) -> None:
    """With Adasum each rank steps first; the parameter becomes start + Adasum(deltas)."""
    start = torch.linspace(-1.0, 1.0, 10, dtype=torch.float64)
    grads = inputs(n, 10, torch.float64, 700)
    deltas = []
    for g in grads:  # every rank's own Adam step from `start`
        w = torch.nn.Parameter(start.clone())
        local = torch.optim.Adam([w], lr=0.1)
        w.grad = g.clone()
        local.step()
        deltas.append((w.detach() - start).numpy())
    want = start.numpy() + tree(deltas)
    w = torch.nn.Parameter(start.clone())
    opt = hvd.DistributedOptimizer(
        torch.optim.Adam([w], lr=0.1), named_parameters=[("w", w)], op=hvd.Adasum
    )
    (w * grads[r]).sum().backward()
    opt.step()
    check_close(w.detach(), want, torch.float64, "Adasum optimizer step")
    # Averaging the gradients first would give another answer.
    averaged_first = start.numpy() - 0.1 * np.sign(tree(grads))
    assert not np.allclose(w.detach().numpy(), averaged_first, atol=1e-6)
    try:
        with opt.skip_synchronize():
            pass
    except AssertionError:
        pass
    else:
        raise AssertionError("skip_synchronize() was accepted with Adasum")


def train(op, r: int, n: int, lr: float) -> float:
    """SGD steps of a linear softmax classifier on overlapping blobs; held-out accuracy."""
    centers = np.random.default_rng(SEED).normal(scale=1.2, size=(4, 8))

    def sample(count: int, seed: int):
        g = np.random.default_rng(seed)
        labels = g.integers(0, 4, size=count)
        x = centers[labels] + g.normal(size=(count, 8))
        return torch.tensor(x, dtype=torch.float32), torch.tensor(labels)

    x, y = sample(16 * 30 * n, 1)
    x, y = x[r::n], y[r::n]  # this rank's shard: 30 batches of 16
    test_x, test_y = sample(4000, 2)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr),
        named_parameters=model.named_parameters(),
        op=op,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(30):
        batch = slice(step * 16, step * 16 + 16)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        opt.step()
    for i, p in enumerate(model.parameters()):
        same_everywhere(p, f"trained.{op.name}.{i}")
    with torch.no_grad():
        return float((model(test_x).argmax(1) == test_y).float().mean())


def refuse_everything(r: int, n: int) -> None:
    calls = {
        "allreduce": lambda: hvd.allreduce(torch.ones(3), op=hvd.Adasum),
        "allreduce_": lambda: hvd.allreduce_(torch.ones(3), op=hvd.Adasum),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([torch.ones(3)], op=hvd.Adasum),
        "allreduce_async": lambda: hvd.allreduce_async(torch.ones(3), op=hvd.Adasum),
        "DistributedOptimizer": lambda: hvd.DistributedOptimizer(
            torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1), op=hvd.Adasum
        ),
    }
    for what, call in calls.items():
        try:
            call()
        except NotImplementedError as err:  # Horovod's class; kolo's NotSupportedError
            assert isinstance(err, NotSupportedError), (what, type(err))
            assert f"{n} ranks" in str(err) and "non-power of 2" in str(err), (what, err)
        else:
            raise AssertionError(f"{what} with Adasum on {n} ranks was accepted")
    # The native engine refuses it too (for adapters that submit directly).
    from kolo import _native

    buf = torch.ones(3)
    try:
        _native.submit(
            "allreduce", "native", buf.data_ptr(), 12, [3], "float32", "Adasum",
            1.0, 1.0, 0, [], 0, -1, 0, True, None,
        )  # fmt: skip
    except InvalidArgumentError as err:
        assert "non-power of 2" in str(err), err
    else:
        raise AssertionError("the engine accepted Adasum on a non-power-of-two job")
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist() == [n, n]


def main() -> None:
    pair, three = kolo.ProcessSet([0, 1]), kolo.ProcessSet([0, 1, 2])
    n_hint = int(os.environ.get("KOLO_SIZE", "1"))
    hvd.init(process_sets=[pair, three] if n_hint >= 4 else None)
    r, n = hvd.rank(), hvd.size()
    if n & (n - 1):
        refuse_everything(r, n)
        print(f"OK rank {r}")
        hvd.shutdown()
        return
    # The checks are spread over the launches to keep each one short.
    check_ops(r, n)
    check_stability(r, n)
    if n == 2:
        check_optimizer_definition(r, n)
    if n == 4:
        check_process_sets(r, n, pair, three)
        adasum = train(hvd.Adasum, r, n, lr=0.1)
        summed = train(hvd.Sum, r, n, lr=0.1)
        if r == 0:
            print(f"accuracy adasum={adasum:.3f} sum={summed:.3f}")
        assert summed > 0.7, summed
        assert adasum >= summed - 0.02, (adasum, summed)
    hvd.allreduce(torch.zeros(1), name="finished")
    print(f"OK rank {r}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
