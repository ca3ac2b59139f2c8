"""Keras ``model.fit`` and a Lightning ``Trainer.fit`` through ``KoloStrategy`` survive a rank
SIGKILLed mid-fit: 3 ranks under an elastic driver (tests/support/elastic_ranks.py: a real
``LaunchDriver``, real processes, a real SIGKILL, the task removed as a launcher does), one
killed mid-epoch; the 2 survivors restore the last commit, reset to 2 ranks, finish every epoch
and end with the same weights, leaving no process or shared-memory segment behind. And jobs
that grow: a rank joining a Lightning fit, and a rank joining a one-rank job (Keras and torch
optimizers must then start averaging)."""

from __future__ import annotations

import json
import sys

import numpy as np
from support.elastic_ranks import ElasticRanks, RankResult

from conftest import worker


def results_of(finished: dict[int, RankResult]) -> list[dict]:
    out = []
    for task, result in finished.items():
        assert result.returncode == 0, f"task {task}:\n{result.stdout[-3000:]}\n{result.stderr}"
        line = [x for x in result.stdout.splitlines() if x.startswith("result ")]
        assert line, f"task {task} printed no result:\n{result.stdout[-3000:]}\n{result.stderr}"
        out.append(json.loads(line[-1].partition(" ")[2]))
    return out


def test_keras_fit_survives_a_killed_rank() -> None:
    env = {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    with ElasticRanks(3, min_np=2, max_np=3, env=env) as ranks:
        for task in range(3):
            ranks.start(task, [sys.executable, worker("keras_elastic_fit_worker.py")])
        # Epoch 0 was committed by every rank; task 2 is inside epoch 1.
        ranks.wait_for(2, lambda line: line.startswith("batch 1 1 3"), timeout=120)
        ranks.kill(2)
        results = results_of(ranks.finish([0, 1], timeout=120))
        assert ranks.driver.failure() is None
        assert ranks.leftovers() == []
        assert ranks.driver.live_tasks() == [0, 1]
    epochs, steps = 4, 3  # keras_elastic_fit_worker.EPOCHS, STEPS
    for result in results:
        assert result["size"] == 2 and result["epochs"] == epochs, result
        # The first round on 3 ranks from epoch 0; after the kill, one on 2 ranks from the
        # last commit (the end of epoch 0, or of epoch 1 if the kill landed after it).
        assert result["rounds"][0] == [0, 3], result["rounds"]
        assert result["rounds"][-1][1] == 2 and result["rounds"][-1][0] in (1, 2), result
        # Restored to an epoch end: the interrupted epoch's steps were undone.
        assert result["steps"] == epochs * steps, result
    assert sorted(r["rank"] for r in results) == [0, 1]
    first, second = ([np.array(w) for w in r["weights"]] for r in results)
    assert all(np.array_equal(a, b) for a, b in zip(first, second)), "the survivors' weights differ"


def test_keras_fit_retraces_its_step_when_a_rank_joins_a_one_rank_job() -> None:
    # A step traced on 1 rank skips the gradient allreduce (nothing to average); after a
    # reset to 2 ranks, fit must trace it again or the ranks stop averaging (and the new
    # rank's allreduce waits for one that never comes).
    env = {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    argv = [sys.executable, worker("keras_elastic_fit_worker.py")]
    # The one rank waits after epoch 0 for the new one: it is announced once it registered.
    with ElasticRanks(1, min_np=1, max_np=2, env={**env, "HOLD_ALONE": "1"}) as ranks:
        ranks.start(0, argv)
        ranks.wait_for(0, lambda line: line.startswith("batch 0 1 1"), timeout=120)
        ranks.add(1, argv)
        results = results_of(ranks.finish([0, 1], timeout=90))
        assert ranks.driver.failure() is None
        assert ranks.leftovers() == []
    for result in results:
        assert result["size"] == 2 and result["epochs"] == 4, result
        assert result["rounds"][-1][1] == 2, result["rounds"]
    assert results[0]["rounds"][0] == [0, 1], results[0]["rounds"]
    first, second = ([np.array(w) for w in r["weights"]] for r in results)
    assert all(np.array_equal(a, b) for a, b in zip(first, second)), (
        "the ranks' weights differ: the step traced on 1 rank did not average the gradients"
    )


def test_lightning_fit_survives_a_killed_rank() -> None:
    with ElasticRanks(3, min_np=2, max_np=3) as ranks:
        for task in range(3):
            ranks.start(task, [sys.executable, worker("lightning_elastic_fit_worker.py")])
        # Epoch 0 was committed by every rank; task 2 is inside epoch 1.
        ranks.wait_for(2, lambda line: line.startswith("batch 1 1 3"), timeout=120)
        ranks.kill(2)
        results = results_of(ranks.finish([0, 1], timeout=120))
        assert ranks.driver.failure() is None
        assert ranks.leftovers() == []
        assert ranks.driver.live_tasks() == [0, 1]
    for result in results:
        assert result["size"] == 2 and result["epochs"] == 4, result
        # Epoch 0 on 3 ranks, then the fit resumed from its commit at the end of epoch 0 on 2
        # (or epoch 1, had the kill landed after it).
        assert result["rounds"][0] == [0, 3], result["rounds"]
        assert result["rounds"][-1][1] == 2 and result["rounds"][-1][0] in (1, 2), result
        # 48 rows, batches of 4 per rank: 4 steps an epoch on 3 ranks, 6 on 2; the steps of
        # the interrupted epoch were undone.
        steps = sum(4 if size == 3 else 6 for size in result["epoch_sizes"])
        assert result["global_step"] == steps, result
        # Equal to one process training each epoch on that epoch's ranks' rows, with one
        # optimizer: weights, momentum and the epoch were resumed from the commit.
        assert result["reference_max_diff"] < 1e-9, result
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert results[0]["weights"] == results[1]["weights"], "the survivors' weights differ"


JOIN_ONE_RANK = (
    "import json, time, torch, kolo.torch as hvd\n"
    "hvd.init()\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.Linear(4, 1)\n"
    "opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),\n"
    "                               named_parameters=model.named_parameters())\n"
    "state = hvd.elastic.TorchState(model, opt, batch=0)\n"
    "@hvd.elastic.run\n"
    "def train(state):\n"
    "    print(f'round {hvd.size()}', flush=True)\n"
    "    start = state.batch\n"
    "    while hvd.size() == 1 or state.batch < start + 5:\n"
    "        opt.zero_grad()\n"
    "        model(torch.full((2, 4), hvd.rank() + 1.0)).sum().backward()\n"
    "        opt.step()\n"
    "        state.batch += 1\n"
    "        time.sleep(0.02 if hvd.size() == 1 else 0)\n"
    "        state.commit()\n"
    "    return [p.tolist() for p in model.parameters()]\n"
    "weights = train(state)\n"
    "hvd.barrier()  # no rank leaves while another is still in its last commit\n"
    "print('result ' + json.dumps(dict(rank=hvd.rank(), size=hvd.size(), weights=weights)))\n"
    "hvd.shutdown()\n"
)


def test_torch_optimizer_of_a_one_rank_elastic_job_averages_once_a_rank_joins() -> None:
    # Horovod registers DistributedOptimizer's gradient hooks in an elastic job even on one
    # rank; without them the first rank never reduces its gradients after a second joins
    # (which then waits for it forever).
    argv = [sys.executable, "-c", JOIN_ONE_RANK]
    with ElasticRanks(1, min_np=1, max_np=2) as ranks:
        ranks.start(0, argv)
        ranks.wait_for(0, lambda line: line == "round 1", timeout=60)
        ranks.add(1, argv)
        results = results_of(ranks.finish([0, 1], timeout=60))
        assert ranks.leftovers() == []
    assert [r["size"] for r in results] == [2, 2], results
    assert results[0]["weights"] == results[1]["weights"], (
        "the ranks' weights differ: the gradients were not averaged"
    )


def test_lightning_fit_grows_when_a_rank_joins() -> None:
    # A task added while 2 ranks fit: they are interrupted at the next epoch-end commit
    # (HostsUpdatedInterrupt, no restore), the new rank takes rank 0's committed checkpoint in
    # the sync, and the 3 resume the fit from it.
    argv = [sys.executable, worker("lightning_elastic_fit_worker.py")]
    # The 2 ranks wait after epoch 0 for the new one: it is announced once it registered.
    with ElasticRanks(2, min_np=2, max_np=3, env={"HOLD_UNTIL_SIZE": "3"}) as ranks:
        for task in range(2):
            ranks.start(task, argv)
        ranks.wait_for(0, lambda line: line.startswith("batch 0 1 2"), timeout=120)
        ranks.add(2, argv)
        results = results_of(ranks.finish([0, 1, 2], timeout=120))
        assert ranks.driver.failure() is None
        assert ranks.leftovers() == []
    first, second, joined = results
    for result in results:
        assert result["size"] == 3 and result["epochs"] == 4, result
    for result in (first, second):
        assert result["rounds"][0] == [0, 2] and result["rounds"][-1][1] == 3, result["rounds"]
        steps = sum(6 if size == 2 else 4 for size in result["epoch_sizes"])
        assert result["global_step"] == steps, result
        assert result["reference_max_diff"] < 1e-9, result
    # The new rank started where the others resumed, from their checkpoint (global step too).
    assert joined["rounds"] == [first["rounds"][-1]], (joined["rounds"], first["rounds"])
    assert joined["global_step"] == first["global_step"], (joined, first)
    assert first["weights"] == second["weights"] == joined["weights"]
