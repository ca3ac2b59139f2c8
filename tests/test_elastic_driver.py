"""The job driver's elastic mode seen from real worker processes: a rank killed with SIGKILL
leaves the job, the survivors get an ``InternalError`` (not ``JobAbortedError``), drain a
"removed" host update, and ``shutdown()`` + ``init()`` into a smaller round where collectives
run on the new membership."""

from __future__ import annotations

import json
import sys
import time

from support.elastic_ranks import ElasticRanks

from kolo._native import LaunchDriver


def start_ready(ranks: ElasticRanks, tasks: range, script: str) -> None:
    """Starts ``tasks`` running ``script`` and waits until each printed "ready"."""
    for task in tasks:
        ranks.start(task, [sys.executable, "-c", script])
    for task in tasks:
        ranks.wait_for(task, lambda line: line == "ready", timeout=60)


def last_json(ranks: ElasticRanks, tasks: list[int]) -> list[dict]:
    """Waits for ``tasks`` to exit 0 and returns the JSON line each printed last."""
    results = ranks.finish(tasks, timeout=60)
    for result in results.values():
        assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(results[t].stdout.strip().splitlines()[-1]) for t in tasks]


RESET_ONCE = (
    "import json, sys, torch, kolo.torch as hvd\n"
    "from kolo import _core\n"
    "from kolo.exceptions import InternalError, JobAbortedError\n"
    "hvd.init(); print('ready', flush=True)\n"
    "try:\n"
    "    while True: hvd.allreduce(torch.ones(256))\n"
    "except JobAbortedError as err:\n"
    "    print(f'aborted: {err}', flush=True); sys.exit(3)\n"
    "except InternalError as err:\n"
    "    error = type(err).__name__\n"
    "updates = _core.host_updates()\n"
    "hvd.shutdown(); hvd.init()\n"
    "total = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()\n"
    "print(json.dumps(dict(error=error, updates=[r for _, r in updates], rank=hvd.rank(),\n"
    "                      size=hvd.size(), total=total)), flush=True)\n"
    "hvd.shutdown()\n"
)


def test_a_killed_rank_leaves_and_the_survivors_continue_on_a_smaller_round() -> None:
    with ElasticRanks(3, min_np=2, max_np=3) as ranks:
        env = dict(ranks.driver.worker_env(0))
        assert float(env["KOLO_ELASTIC_TIMEOUT"]) == 600.0
        start_ready(ranks, range(3), RESET_ONCE)
        time.sleep(0.2)  # the allreduce loop is running on every rank
        ranks.kill(2)
        # A failure report of an elastic job's task removes it (it does not abort the job).
        ranks.driver.report_task_failure(2, "was killed by signal 9 (SIGKILL)")
        results = last_json(ranks, [0, 1])
        assert ranks.driver.failure() is None
        assert ranks.driver.live_tasks() == [0, 1]
        for result in results:
            assert result["error"] in ("InternalError", "PeerConnectionError"), result
            assert result["size"] == 2 and result["total"] == 2.0, result
        assert sorted(r["rank"] for r in results) == [0, 1]
        # Both drained the "removed" update (HostUpdateResult.removed == 1) before resetting,
        # unless their allreduce failed on the broken socket first and they drained earlier.
        assert any(1 in r["updates"] for r in results), results


def test_elastic_arguments_are_checked() -> None:
    import pytest

    from kolo.exceptions import ConfigError, InvalidArgumentError

    with pytest.raises(ConfigError, match="min_np 3 and max_np 2"):
        LaunchDriver(2, min_np=3, max_np=2)
    with pytest.raises(InvalidArgumentError, match="fresh secret"):
        LaunchDriver(1, min_np=1, secret="ab" * 32, job_id="cd" * 16)
    fixed = LaunchDriver(1)
    try:
        with pytest.raises(ConfigError, match="elastic"):
            fixed.add_tasks([1])
    finally:
        fixed.shutdown()


ADDED_MIDWAY = (
    "import json, os, time, torch, kolo.torch as hvd\n"
    "from kolo.exceptions import HostsUpdatedInterrupt\n"
    "hvd.init()\n"
    "raised = None\n"
    "if os.environ['KOLO_TASK_INDEX'] != '2':\n"
    "    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)\n"
    "    print('ready', flush=True)\n"
    "    for step in range(20000):\n"
    "        hvd.allreduce(torch.ones(8), name='step')\n"
    "        try:\n"
    "            state.commit()\n"
    "        except HostsUpdatedInterrupt as interrupt:\n"
    "            raised = dict(step=step, skip_sync=interrupt.skip_sync)\n"
    "            break\n"
    "        time.sleep(0.001)\n"
    "    hvd.shutdown(); hvd.init()\n"
    "total = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()\n"
    "print(json.dumps(dict(raised=raised, size=hvd.size(), total=total)), flush=True)\n"
    "hvd.shutdown()\n"
)


def test_an_added_task_interrupts_every_rank_at_the_same_commit() -> None:
    """The driver's "added" notice reaches the ranks at different moments; every rank still
    raises HostsUpdatedInterrupt at the same commit (no collective decides it), with
    skip_sync False, and the new task joins the next round."""
    with ElasticRanks(2, min_np=2, max_np=3) as ranks:
        start_ready(ranks, range(2), ADDED_MIDWAY)
        time.sleep(0.3)  # the step loop is running on both ranks
        ranks.add(2, [sys.executable, "-c", ADDED_MIDWAY])
        first, second, new = last_json(ranks, [0, 1, 2])
        assert first["raised"] is not None and first["raised"] == second["raised"], (first, second)
        assert first["raised"]["skip_sync"] is False, first
        assert new["raised"] is None
        assert all(r["size"] == 3 and r["total"] == 3.0 for r in (first, second, new))


SETS_ACROSS_A_RESET = (
    "import json, torch, kolo.elastic, kolo.torch as hvd\n"
    "from kolo.exceptions import InternalError, InvalidArgumentError\n"
    "a, b = hvd.ProcessSet([1, 2]), hvd.ProcessSet([0, 1])\n"
    "hvd.init(process_sets=[a, b])\n"
    "ids = [a.process_set_id, b.process_set_id]\n"
    "print('ready', flush=True)\n"
    "try:\n"
    "    while True: hvd.allreduce(torch.ones(64))\n"
    "except InternalError:\n"
    "    pass\n"
    "kolo.elastic.reset()\n"
    "total = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=b).item()\n"
    "try:\n"
    "    hvd.allreduce(torch.ones(1), process_set=a)\n"
    "    left_out = None\n"
    "except InvalidArgumentError as err:\n"
    "    left_out = str(err)\n"
    "print(json.dumps(dict(ids=ids, after=[a.process_set_id, b.process_set_id], total=total,\n"
    "                      left_out=left_out, included=a.included(), size=hvd.size())),\n"
    "      flush=True)\n"
    "hvd.shutdown()\n"
)


def test_process_sets_are_registered_again_after_a_reset_with_stable_ids() -> None:
    """Sets given to init(process_sets=...) come back after an elastic reset: one that still
    fits the smaller job keeps its id even though the set before it no longer fits; the one
    that does not fit says why when used."""
    with ElasticRanks(3, min_np=2, max_np=3) as ranks:
        start_ready(ranks, range(3), SETS_ACROSS_A_RESET)
        time.sleep(0.2)
        ranks.kill(2)
        for result in last_json(ranks, [0, 1]):
            assert result["ids"] == [1, 2] and result["size"] == 2, result
            assert result["after"] == [None, 2], "b keeps id 2; a does not fit 2 ranks"
            assert result["total"] == 2.0 and result["included"] is None, result
            assert "not registered in this round" in result["left_out"], result
            assert "[1, 2] need at least 3 ranks" in result["left_out"], result
        assert ranks.leftovers() == []


#: How long the added worker (task 2) sleeps before its first hvd.init() (a slow start).
SLOW_START = 3.0

STEP_UNTIL_JOINED = (
    "import os, time, torch, kolo.torch as hvd\n"
    f"time.sleep({SLOW_START} if os.environ['KOLO_TASK_INDEX'] == '2' else 0)\n"
    "hvd.init()\n"
    "state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0, big_from=-1)\n"
    "@hvd.elastic.run\n"
    "def train(state):\n"
    "    while True:\n"
    "        if hvd.size() == 3:\n"
    "            if state.big_from < 0: state.big_from = state.step\n"
    "            if state.step >= state.big_from + 5: return\n"
    "        hvd.allreduce(torch.ones(8), name='step')\n"
    "        print(f'step {time.time():.6f} {hvd.size()}', flush=True)\n"
    "        state.step += 1\n"
    "        state.commit()\n"
    "        time.sleep(0.005)\n"
    "train(state)\n"
    "hvd.shutdown()\n"
)


def test_an_added_worker_is_announced_only_once_it_registers() -> None:
    """The running ranks keep stepping while an added worker starts (here it sleeps before its
    first init(), as a slow import would) and reset only once it registered: their pause
    between their last step on 2 ranks and their first on 3 does not contain its start."""
    argv = [sys.executable, "-c", STEP_UNTIL_JOINED]
    with ElasticRanks(2, min_np=2, max_np=3) as ranks:
        for task in range(2):
            ranks.start(task, argv)
        for task in range(2):
            ranks.wait_for(task, lambda line: line.startswith("step "), timeout=60)
        added = time.time()
        ranks.add(2, argv)
        results = ranks.finish([0, 1, 2], timeout=90)
        assert ranks.leftovers() == []
    outputs = []
    for task in range(3):
        assert results[task].returncode == 0, results[task].stderr[-3000:]
        lines = results[task].stdout.splitlines()
        outputs.append([(float(t), int(n)) for _, t, n in map(str.split, lines)])
    for steps in outputs[:2]:
        # Steps on 2 ranks while the added worker slept: nobody was waiting for it.
        during = [t for t, n in steps if n == 2 and added + 0.5 < t < added + SLOW_START]
        assert len(during) > 10, f"{len(during)} steps on 2 ranks during its start"
        last_small = max(t for t, n in steps if n == 2)
        first_big = min(t for t, n in steps if n == 3)
        assert last_small > added + SLOW_START, "the survivors reset before it was ready"
        pause = first_big - last_small
        assert pause < SLOW_START / 2, f"the survivors paused {pause:.2f} s for it"
    assert [n for _, n in outputs[2]] == [3] * 5


#: Task 0 registers early (as a Spark or Ray rank process does at start, before the user's
#: function runs) and calls init() only once the file ``KOLO_TEST_GO`` exists; both tasks then
#: step (one allreduce, one commit) until a step ran on 2 ranks, at most 300 steps.
EARLY_THEN_INIT = (
    "import json, os, time, torch, kolo.torch as hvd\n"
    "from kolo import _native\n"
    "if os.environ['KOLO_TASK_INDEX'] == '0':\n"
    "    for name, value in _native.session_join(): os.environ[name] = value\n"
    "    print('registered', flush=True)\n"
    "    deadline = time.monotonic() + 60\n"
    "    while not os.path.exists(os.environ['KOLO_TEST_GO']) and time.monotonic() < deadline:\n"
    "        time.sleep(0.01)\n"
    "hvd.init()\n"
    "state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0, sizes=[])\n"
    "@hvd.elastic.run\n"
    "def train(state):\n"
    "    while not (state.sizes and state.sizes[-1] == 2) and state.step < 300:\n"
    "        total = int(hvd.allreduce(torch.ones(1), op=hvd.Sum).item())\n"
    "        state.sizes = [*state.sizes, total]\n"
    "        state.step += 1\n"
    "        state.commit()\n"
    "        time.sleep(0.01)\n"
    "train(state)\n"
    "print(json.dumps(dict(rank=hvd.rank(), size=hvd.size(), sizes=state.sizes)), flush=True)\n"
    "hvd.shutdown()\n"
)


def test_a_task_added_between_an_early_registration_and_init_is_not_missed(tmp_path) -> None:
    """Spark and Ray rank processes register before the user's function calls init(), which
    adopts that registration. A task added and registered in between is news to that rank: it
    resets at its first commit and the job grows, instead of stepping alone while the new task
    waits for a round that never completes (the CI failure of the Spark join test). init()
    adopts the registration although session_join put its hostname into the environment."""
    go = tmp_path / "go"
    argv = [sys.executable, "-c", EARLY_THEN_INIT]
    with ElasticRanks(1, min_np=1, max_np=2, env={"KOLO_TEST_GO": str(go)}) as ranks:
        ranks.start(0, argv)
        ranks.wait_for(0, lambda line: line == "registered", timeout=60)
        ranks.add(1, argv)
        deadline = time.monotonic() + 60
        while ranks.driver.is_joining(1):
            assert time.monotonic() < deadline, "task 1 never registered"
            time.sleep(0.01)
        go.touch()
        first, added = last_json(ranks, [0, 1])
        assert ranks.leftovers() == []
    assert (first["rank"], first["size"], added["size"]) == (0, 2, 2), (first, added)
    assert first["sizes"] == added["sizes"], (first, added)
    # init() adopted the early registration (its first step ran in that round, alone), then
    # the first commit reset it into the round with task 1.
    assert first["sizes"][0] == 1 and first["sizes"][-1] == 2, first
    assert set(first["sizes"][:-1]) == {1}, first
