"""kolo's elastic API on real ranks (run under ``kolorun -np 2``): each scenario checks its own
result and prints ``rank R: <scenario> ok``; the first failure stops the launch."""

from __future__ import annotations

import random
import sys

import torch

import kolo.torch as hvd
from kolo.elastic import HostUpdateResult
from kolo.exceptions import HostsUpdatedInterrupt


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1)
    )


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: int) -> None:
    """One deterministic training step, the same on every rank (gradients averaged)."""
    torch.manual_seed(1000 + batch)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def mismatched_allreduce() -> None:
    """A real collective failure on every rank: the ranks disagree on the shape."""
    hvd.allreduce(torch.ones(2 + hvd.rank()), name="elastic.mismatch")


def scenario_torch_state() -> None:
    rank = hvd.rank()
    model = make_model(seed=rank)  # different weights on each rank until the sync
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, optimizer, epoch=10 + rank, batch=20 + rank)
    state.sync()
    reference = make_model(seed=0)
    assert same(params(state.model), params(reference)), "sync did not give rank 0's model"
    assert (state.epoch, state.batch) == (10, 20), (state.epoch, state.batch)

    # Train (momentum buffers appear), commit, train on, restore: back to the commit.
    step(model, optimizer, 0)
    state.epoch, state.batch = 11, 21
    state.commit()
    committed = params(model)
    committed_momentum = {
        i: s["momentum_buffer"].clone() for i, s in optimizer.state_dict()["state"].items()
    }
    assert committed_momentum, "no optimizer state to commit"
    for batch in (1, 2):
        step(model, optimizer, batch)
    state.epoch, state.batch = 12, 22
    assert not same(params(model), committed)
    state.restore()
    assert same(params(model), committed), "restore did not bring the committed model back"
    assert (state.epoch, state.batch) == (11, 21), (state.epoch, state.batch)
    momentum = {i: s["momentum_buffer"] for i, s in optimizer.state_dict()["state"].items()}
    assert all(torch.equal(momentum[i], committed_momentum[i]) for i in committed_momentum)

    # A second restore after more steps gives the commit again: the restored optimizer's
    # in-place updates must not have written into the committed copy.
    step(model, optimizer, 3)
    state.restore()
    momentum = {i: s["momentum_buffer"] for i, s in optimizer.state_dict()["state"].items()}
    assert all(torch.equal(momentum[i], committed_momentum[i]) for i in committed_momentum), (
        "the commit changed after a restore: the optimizer updated the committed tensors"
    )
    assert same(params(model), committed)

    # The commit lives in host memory and is a copy, not the live tensors.
    saved = state._handlers["model"]._saved_model_state
    assert all(t.device.type == "cpu" for t in saved.values())
    live = dict(model.state_dict())
    assert all(saved[k].data_ptr() != live[k].data_ptr() for k in saved)
    # The next commit overwrites the same host buffers (no new allocation) with the new values.
    step(model, optimizer, 4)
    state.commit()
    again = state._handlers["model"]._saved_model_state
    assert all(again[k].data_ptr() == saved[k].data_ptr() for k in saved), "buffers reallocated"
    assert same(again, params(model))
    state.restore()

    # Assigning a new model to the state tracks (and commits) it.
    replacement = make_model(seed=5)
    state.model = replacement
    with torch.no_grad():
        for p in replacement.parameters():
            p.add_(1.0)
    state.restore()
    assert same(params(replacement), params(make_model(seed=5)))


def scenario_object_state() -> None:
    rank = hvd.rank()
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, epoch=rank, names=[f"r{rank}"])
    state.sync()
    assert (state.epoch, state.names) == (0, ["r0"]), (state.epoch, state.names)
    state.epoch = 5
    state.restore()
    assert state.epoch == 0
    state.epoch, state.names = 6, ["x", "y"]
    state.commit()
    state.epoch, state.names = 7, []
    state.restore()
    assert (state.epoch, state.names) == (6, ["x", "y"]), (state.epoch, state.names)


def scenario_recover() -> None:
    """A collective fails on every rank mid-training: the ranks restore the last commit, reset
    through shutdown()+init(), sync, and finish with the model of an uninterrupted run (the
    DistributedOptimizer averaging gradients before and after the reset; every rank has the
    same data, so the average is the single-process gradient)."""
    model = make_model(seed=hvd.rank())
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    state = hvd.elastic.TorchState(model, optimizer, batch=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append((hvd.rank(), hvd.size()))])
    seen = []
    failed = []

    @hvd.elastic.run
    def train(state, total):
        seen.append(state.batch)
        while state.batch < total:
            step(state.model, state.optimizer, state.batch)
            state.batch += 1
            if state.batch % 2 == 0:
                state.commit()
            elif state.batch == 5 and not failed:
                # Batch 4 was committed; this step (batch 5) is lost with the failure.
                failed.append(True)
                mismatched_allreduce()
        return params(state.model)

    final = train(state, 8)
    assert resets == [(hvd.rank(), 2)], resets
    assert seen == [0, 4], f"rounds started at batches {seen}: expected 0, then the commit at 4"
    assert hvd.is_initialized() and hvd.size() == 2

    reference = make_model(seed=0)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for batch in range(8):
        step(reference, ref_opt, batch)
    assert same(final, params(reference)), "the recovered run differs from an uninterrupted one"
    total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="elastic.after_recover")
    assert total.item() == 2.0


def scenario_hosts_updated() -> None:
    """HostsUpdatedInterrupt from user code resets without restoring; skip_sync skips the
    sync."""
    for skip_sync in (False, True):
        hosts_updated_once(skip_sync)


def hosts_updated_once(skip_sync: bool) -> None:
    model = make_model(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model, optimizer, rounds=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(1)])
    rounds = []

    @hvd.elastic.run
    def train(state):
        rounds.append(params(state.model))
        if len(rounds) == 1:
            with torch.no_grad():  # uncommitted, different on each rank
                for p in state.model.parameters():
                    p.add_(1.0 + hvd.rank())
            raise HostsUpdatedInterrupt(skip_sync)
        return params(state.model)

    final = train(state)
    assert resets == [1], resets
    moved_by = 2.0 if (skip_sync and hvd.rank() == 1) else 1.0
    with torch.no_grad():
        reference = make_model(seed=0)
        for p in reference.parameters():
            p.add_(moved_by)
    assert same(final, params(reference)), (
        f"skip_sync={skip_sync}: not the uncommitted weights "
        + ("of this rank (restored or synced?)" if skip_sync else "of rank 0 (restored?)")
    )


def scenario_check_host_updates() -> None:
    """Rank 0's host update interrupts every rank at the same commit; one only rank 1 got
    does not (rank 0's view decides, as in Horovod). A commit costs no collective: rank 0's
    view reaches the others in the cycle of the step before it."""
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, batch=0)

    def train_step() -> None:
        hvd.allreduce(torch.ones(4), name="check_host_updates.step")

    train_step()
    before = hvd.engine_stats()
    for _ in range(50):
        state.commit()  # nothing new: no interrupt, and no collective
    after = hvd.engine_stats()
    for counter in ("tensors", "collectives"):
        assert after[counter] == before[counter], (counter, before, after)
    if hvd.rank() == 1:
        state.on_hosts_updated(50.0, HostUpdateResult.added)
    train_step()
    state.commit()  # rank 1's update alone does not interrupt
    if hvd.rank() == 0:
        state.on_hosts_updated(100.0, HostUpdateResult.removed)
    for expected_skip in (True, False):
        train_step()
        try:
            state.commit()
        except HostsUpdatedInterrupt as interrupt:
            assert interrupt.skip_sync is expected_skip, (interrupt.skip_sync, expected_skip)
        else:
            raise AssertionError(f"rank {hvd.rank()}: rank 0's update did not interrupt")
        state.commit()  # raised once: the same view again does not interrupt twice
        if hvd.rank() == 0:
            # An older update is ignored; a newer one mixing additions needs the sync.
            state.on_hosts_updated(90.0, HostUpdateResult.added)
            state.on_hosts_updated(150.0, HostUpdateResult.removed)
            state.on_hosts_updated(120.0, HostUpdateResult.added)
    train_step()
    state.commit()  # everything handled: no interrupt
    assert state._last_updated_timestamp == 150.0, state._last_updated_timestamp


def scenario_sampler() -> None:
    dataset = list(range(20))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
    state = hvd.elastic.TorchState(sampler=sampler)
    state.sync()
    order = list(range(20))
    random.Random(3).shuffle(order)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=sampler)
    batches = iter(loader)
    first = next(batches).tolist()
    assert first == order[hvd.rank() : 4 : 2], (first, order)
    sampler.record_batch(0, 2)
    state.commit()
    sampler.record_batch(1, 2)  # uncommitted
    state.restore()
    assert sampler.processed_num == 4, sampler.processed_num
    rest = [i for b in loader for i in b.tolist()]
    assert rest == order[4 + hvd.rank() :: 2], (rest, order)
    everything = hvd.allgather_object(rest)
    assert sorted(everything[0] + everything[1]) == sorted(order[4:])


SCENARIOS = {
    "torch_state": scenario_torch_state,
    "object_state": scenario_object_state,
    "recover": scenario_recover,
    "hosts_updated": scenario_hosts_updated,
    "check_host_updates": scenario_check_host_updates,
    "sampler": scenario_sampler,
}


def main() -> None:
    hvd.init()
    for name in sys.argv[1:]:
        SCENARIOS[name]()
        print(f"rank {hvd.rank()}: {name} ok", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
