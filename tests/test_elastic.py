"""kolo's elastic Python API on real ranks under kolorun (fixed size): TorchState and
ObjectState commit/restore/sync, the run decorator recovering from a real collective failure
through shutdown()+init(), HostsUpdatedInterrupt, check_host_updates' rank-0
agreement, and ElasticSampler resuming and re-splitting across 3 → 2 ranks.

tests/workers/elastic_worker.py runs the scenarios in one launch (in order; a failing scenario
stops the launch, so the tests of the later ones fail too, saying so).
"""

from __future__ import annotations

import functools
import json
import random
import subprocess

import pytest

from conftest import check_scenario, output_tail, run_kolorun, worker

SCENARIOS = (
    "torch_state",
    "object_state",
    "check_host_updates",
    "sampler",
    "recover",
    "hosts_updated",
)


@functools.cache
def launch() -> subprocess.CompletedProcess:
    return run_kolorun(["-np", "2", "python", worker("elastic_worker.py"), *SCENARIOS], timeout=120)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_elastic_scenario_passes_on_both_ranks(scenario: str) -> None:
    check_scenario(launch(), scenario, SCENARIOS)


def test_elastic_sampler_resplits_the_rest_of_the_epoch_from_3_to_2_ranks(tmp_path) -> None:
    for phase, np in (("first", 3), ("second", 2)):
        result = run_kolorun(
            ["-np", str(np), "python", worker("elastic_sampler_worker.py"), phase, str(tmp_path)],
            timeout=60,
        )
        assert result.returncode == 0, output_tail(result)
    order = list(range(23))
    random.Random(7).shuffle(order)
    first = [json.loads((tmp_path / f"first-{r}.json").read_text()) for r in range(3)]
    second = [json.loads((tmp_path / f"second-{r}.json").read_text()) for r in range(2)]
    processed = [i for seen in first for i in seen]
    assert sorted(processed) == sorted(order[:12]), "3 ranks x 2 batches x 2 = the first 12"
    rest = [i for seen in second for i in seen]
    # 11 remain: 6 per rank, the last one padded with the first remaining index.
    assert len(second[0]) == len(second[1]) == 6, second
    assert set(rest) == set(order[12:]), "the 2 ranks must cover exactly the unprocessed samples"
    assert not set(rest) & set(processed), "a processed sample was repeated after the re-split"
    assert second[0] == order[12::2] and second[1] == [*order[13::2], order[12]], second


def test_keras_state_callbacks_and_recovery_in_a_two_rank_fit() -> None:
    result = run_kolorun(
        ["-np", "2", "python", worker("keras_elastic_worker.py")],
        timeout=180,
        env={"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:rank {rank}: keras elastic ok" in result.stdout, (
            result.stdout[-3000:] + result.stderr[-5000:]
        )
    assert result.returncode == 0, result.stderr[-3000:]


COMMIT_AFTER_A_PEER_FINISHED = (
    "import time, torch, kolo.torch as hvd\n"
    "hvd.init()\n"
    "state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)\n"
    "hvd.allreduce(torch.ones(4), name='last_step')\n"
    "if hvd.rank() == 0:\n"
    "    hvd.shutdown()\n"
    "else:\n"
    "    time.sleep(1.0)  # rank 0 finished and shut down meanwhile\n"
    "    state.step = 1\n"
    "    state.commit()\n"
    "    print('rank 1 committed after rank 0 finished', flush=True)\n"
)


def test_a_commit_after_a_finished_peer_shut_down_still_succeeds() -> None:
    """The last commit of a slower rank needs no collective, so a peer that already finished
    and shut the engine down must not turn it into a failure (and an elastic reset)."""
    result = run_kolorun(["-np", "2", "python", "-c", COMMIT_AFTER_A_PEER_FINISHED], timeout=60)
    assert "rank 1 committed after rank 0 finished" in result.stdout, (
        result.stdout[-2000:] + result.stderr[-4000:]
    )
    assert result.returncode == 0, result.stderr[-3000:]
