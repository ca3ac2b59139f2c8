"""kolo.ray.RayExecutor on a real Ray instance: placement, ranks, stateful executables,
collectives, fail-fast and cleanup (single node; multi-node through ray.cluster_utils)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

pytestmark = pytest.mark.ray

ray = pytest.importorskip("ray")

from kolo.exceptions import (  # noqa: E402
    InvalidArgumentError,
    InvalidValueError,
    LaunchError,
    PlacementGroupTimeoutError,
    RankFailedError,
)
from kolo.exceptions import TimeoutError as KoloTimeoutError  # noqa: E402
from kolo.ray import RayExecutor  # noqa: E402

# The job driver service and the data plane on loopback only.
SETTINGS = RayExecutor.create_settings(timeout_s=60, nics=["lo"])


def _alive_kolo_actors(actor_ids: set) -> list:
    # The GCS's actor table (ray.util.state needs the dashboard, which these tests leave off).
    from ray._private import state

    return [
        actor
        for actor in state.actors().values()
        if actor.get("ActorID") in actor_ids and actor.get("State") != "DEAD"
    ]


def _live_kolo_groups(names: set) -> list:
    return [
        group
        for group in ray.util.placement_group_table().values()
        if group["name"].startswith("kolo-ray-")
        and (not names or group["name"] in names)
        and group["state"] != "REMOVED"
    ]


def _owned(executor) -> tuple:
    """The ids of the executor's actors and the name of its placement group."""
    actors = {actor._actor_id.hex() for actor in executor.workers}
    group = executor._placement_group
    return actors, ({_group_name(group)} if group else set())


def _group_name(group) -> str:
    return ray.util.placement_group_table(group)["name"]


def _assert_cleaned_up(owned: tuple = (set(), set())) -> None:
    """No actor of `owned` alive and no kolo placement group of `owned` (all kolo groups when
    none is named) left."""
    actors, groups = owned
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if not _alive_kolo_actors(actors) and not _live_kolo_groups(groups):
            return
        time.sleep(0.5)
    assert _alive_kolo_actors(actors) == []
    assert _live_kolo_groups(groups) == []


class Counter:
    """A stateful executable: the rank variables are set before it is built."""

    def __init__(self, start):
        import kolo.torch as hvd

        hvd.init()
        self.rank = hvd.rank()
        self.value = start

    def step(self):
        self.value += 1
        return self.rank, self.value


def _rank_info(tag):
    import torch

    import kolo.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    return {
        "tag": tag,
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(),
        "env_rank": int(os.environ["KOLO_RANK"]),
        "sum": total,
        "pid": os.getpid(),
    }


@pytest.fixture(scope="module")
def executor(ray_local):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    executor = RayExecutor(SETTINGS, num_workers=3)
    executor.start(executable_cls=Counter, executable_args=[10])
    print(f"\nstart() to every rank registered and built: {executor.start_seconds:.2f} s")
    owned = _owned(executor)
    yield executor
    executor.shutdown()
    _assert_cleaned_up(owned)


def test_run_gives_unique_ranks_and_correct_collectives(executor):
    results = executor.run(_rank_info, args=["a"])
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["size"] == 3 and r["local_size"] == 3 for r in results)
    assert [r["local_rank"] for r in results] == [0, 1, 2]
    assert [r["cross_rank"] for r in results] == [0, 0, 0]
    assert [r["env_rank"] for r in results] == [0, 1, 2]
    assert all(r["sum"] == 6.0 for r in results)
    assert all(r["tag"] == "a" for r in results)
    assert len({r["pid"] for r in results}) == 3
    assert [info["pid"] for info in executor.worker_info()] == [r["pid"] for r in results]
    # A second run reuses the same initialized ranks (init() is a no-op).
    again = executor.run(_rank_info, kwargs={"tag": "b"})
    assert [r["pid"] for r in again] == [r["pid"] for r in results]
    began = time.monotonic()
    for _ in range(20):
        assert executor.run(lambda: None) == [None, None, None]
    print(f"per-run overhead of an empty fn: {(time.monotonic() - began) / 20 * 1000:.1f} ms")


def test_execute_keeps_state_and_execute_single_runs_on_rank_0(executor):
    first = executor.execute(lambda model: model.step())
    second = executor.execute(lambda model: model.step())
    assert [rank for rank, _ in first] == [0, 1, 2]
    assert [value for _, value in second] == [value + 1 for _, value in first]
    assert executor.execute_single(lambda model: model.rank) == 0
    before = executor.execute(lambda model: model.value)
    executor.execute_single(lambda model: model.step())
    after = executor.execute(lambda model: model.value)
    assert after == [before[0] + 1, before[1], before[2]]


def test_run_remote_returns_refs_by_rank(executor):
    refs = executor.run_remote(lambda x: int(os.environ["KOLO_RANK"]) * x, args=[5])
    assert all(isinstance(ref, ray.ObjectRef) for ref in refs)
    assert ray.get(refs, timeout=60) == [0, 5, 10]


def _blocking_allreduce(marker):
    import torch

    import kolo.torch as hvd

    hvd.init()
    while True:  # every rank loops in collectives until the job breaks
        hvd.allreduce(torch.ones(4), name=marker)


def _raise_on_rank_1():
    import torch

    import kolo.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise RuntimeError("rank one exploded")
    while True:
        hvd.allreduce(torch.ones(4))


@pytest.mark.parametrize("how", ["sigkill", "ray.kill"])
def test_killed_actor_fails_fast_and_cleans_up(ray_local, how):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    executor = RayExecutor(SETTINGS, num_workers=2)
    executor.start()
    owned = _owned(executor)
    victim = executor.worker_info()[1]
    actor = executor.workers[1]
    killed_at = []

    def kill():
        time.sleep(2.0)
        killed_at.append(time.monotonic())
        if how == "sigkill":
            os.kill(victim["pid"], signal.SIGKILL)
        else:
            ray.kill(actor, no_restart=True)

    killer = threading.Thread(target=kill)
    killer.start()
    with pytest.raises(RankFailedError) as caught:
        executor.run(_blocking_allreduce, args=["loop"])
    detected = time.monotonic() - killed_at[0]
    killer.join()
    print(f"\n{how}: RankFailedError {detected:.2f} s after the kill: {caught.value}")
    assert detected < 30
    assert caught.value.rank == 1
    assert victim["node_id"] in caught.value.host
    assert "rank 1" in str(caught.value)
    assert caught.value.remote_traceback
    _assert_cleaned_up(owned)  # the surviving actor was stopped too, the group removed
    with pytest.raises(LaunchError, match="not started"):
        executor.run(lambda: None)
    executor.shutdown()  # idempotent


def test_raising_rank_fails_fast_with_remote_traceback(ray_local):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    executor = RayExecutor(SETTINGS, num_workers=2)
    executor.start()
    owned = _owned(executor)
    began = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        executor.run(_raise_on_rank_1)
    print(f"\nraise: RankFailedError after {time.monotonic() - began:.2f} s")
    assert caught.value.rank == 1
    assert "rank one exploded" in caught.value.remote_traceback
    assert "Traceback" in caught.value.remote_traceback
    executor.shutdown()
    _assert_cleaned_up(owned)


def test_unsatisfiable_placement_group_times_out_with_resources(ray_local):
    settings = RayExecutor.create_settings(placement_group_timeout_s=2, nics=["lo"])
    executor = RayExecutor(settings, num_workers=2, cpus_per_worker=64)
    began = time.monotonic()
    with pytest.raises(PlacementGroupTimeoutError) as caught:
        executor.start()
    waited = time.monotonic() - began
    assert 2 <= waited < 20
    assert isinstance(caught.value, KoloTimeoutError)
    assert isinstance(caught.value, TimeoutError)  # the builtin one too
    message = str(caught.value)
    assert "2 bundles of {CPU: 64} (PACK), {CPU: 128} in all" in message
    assert "available now" in message and "'CPU'" in message
    assert caught.value.requested == [{"CPU": 64.0}, {"CPU": 64.0}]
    assert "CPU" in caught.value.available
    assert executor._placement_group is None
    assert not [
        group
        for group in ray.util.placement_group_table().values()
        if group["bundles"]
        and group["bundles"][0].get("CPU") == 64.0
        and group["state"] != "REMOVED"
    ]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "Either `num_workers` or `num_hosts` must be set"),
        ({"num_workers": 2, "num_hosts": 2}, "Only one of `num_workers` and `num_hosts`"),
        ({"num_workers": 2, "gpus_per_worker": 1}, "gpus_per_worker is set, but use_gpu is False"),
        ({"num_workers": 2, "use_gpu": True, "gpus_per_worker": 0}, "gpus_per_worker must be > 0"),
        ({"num_workers": 0}, "`num_workers` must be at least 1"),
        ({"num_hosts": 1, "num_workers_per_host": 0}, "`num_workers_per_host` must be at least 1"),
        ({"num_workers": "2"}, "`num_workers` must be an int"),
    ],
)
def test_argument_errors_are_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match) as caught:
        RayExecutor(SETTINGS, **kwargs)
    assert isinstance(caught.value, InvalidArgumentError)
    assert isinstance(caught.value, InvalidValueError)
    with pytest.raises(ValueError, match="timeout_s"):
        RayExecutor.create_settings(timeout_s=0)


MULTI_NODE = textwrap.dedent(
    """
    import json, sys, time
    import ray
    from ray.cluster_utils import Cluster
    from kolo.ray import RayExecutor

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "object_store_memory": 100 * 1024 * 1024})
    cluster.add_node(num_cpus=2, object_store_memory=100 * 1024 * 1024)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR")

    def info():
        import os, torch
        import kolo.torch as hvd
        hvd.init()
        total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
        return [hvd.rank(), hvd.local_rank(), hvd.cross_rank(), hvd.local_size(),
                hvd.cross_size(), os.environ["KOLO_RAY_NODE_ID"], total]

    out = {}
    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=60, nics=["lo"])
    for name, kwargs in [("spread", {"num_hosts": 2, "num_workers_per_host": 2}),
                         ("pack", {"num_workers": 4})]:
        executor = RayExecutor(settings, **kwargs)
        executor.start()
        out[name] = {"run": executor.run(info), "info": executor.worker_info()}
        executor.shutdown()
    print("RESULT " + json.dumps(out))
    ray.shutdown()
    cluster.shutdown()
    """
)


def test_multi_node_ranks_are_consecutive_per_node():
    """A head plus one worker node (ray.cluster_utils.Cluster, joined with
    ray.init(address=...)), 2 CPUs each: STRICT_SPREAD and PACK both give each node two
    consecutive ranks."""
    env = dict(os.environ, RAY_DEDUP_LOGS="0")
    proc = subprocess.run(
        [sys.executable, "-c", MULTI_NODE],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[0][len("RESULT ") :])
    for name in ("spread", "pack"):
        run = out[name]["run"]
        assert [row[0] for row in run] == [0, 1, 2, 3], name
        assert [row[1] for row in run] == [0, 1, 0, 1], name
        assert [row[2] for row in run] == [0, 0, 1, 1], name
        assert all(row[3] == 2 and row[4] == 2 for row in run), name
        nodes = [row[5] for row in run]
        assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2], name
        assert [info["node_id"] for info in out[name]["info"]] == nodes, name
        assert all(row[6] == 6.0 for row in run), name


def test_executor_workers_are_base_horovod_workers(executor):
    """The handles in ``executor.workers`` answer Horovod's BaseHorovodWorker calls."""
    from kolo.ray import BaseHorovodWorker
    from kolo.ray._worker import _RankActor
    from kolo.ray.worker import BaseHorovodWorker as from_module

    assert from_module is BaseHorovodWorker and issubclass(_RankActor, BaseHorovodWorker)
    workers = executor.workers
    envs = ray.get([w.env_vars.remote() for w in workers])
    assert [env["HOROVOD_RANK"] for env in envs] == ["0", "1", "2"]
    assert all(env["HOROVOD_SIZE"] == "3" for env in envs)
    assert ray.get(workers[0].hostname.remote()) == socket.gethostname()
    assert ray.get(workers[0].get_gpu_ids.remote()) == []
    ray.get(workers[1].update_env_vars.remote({"KOLO_TEST_FLAG": 7}))
    assert executor.run(lambda: os.environ.get("KOLO_TEST_FLAG")) == [None, "7", None]
    # execute(fn) is fn(executable): the Counter built by start(executable_cls=Counter).
    assert ray.get(workers[2].execute.remote(lambda counter: counter.rank)) == 2


def _log_to_queue(_executable):
    from kolo.ray.worker import log

    log({"a": 1})


def _log_twice(tag):
    from kolo.ray.worker import log

    rank = int(os.environ["KOLO_RANK"])
    for step in range(2):
        log({"tag": tag, "rank": rank, "step": step})
    return rank


def test_run_and_execute_hand_logged_values_to_callbacks(executor):
    # Horovod's RayExecutor.run/execute(..., callbacks=[...]): each callback gets every value
    # the workers log with ray_logger.log (kolo.ray.worker.log) through the queue.
    seen, counted = [], []
    assert executor.run(_log_twice, args=["run"], callbacks=[seen.append, counted.append]) == [
        0,
        1,
        2,
    ]
    assert sorted((v["rank"], v["step"]) for v in seen) == [
        (r, s) for r in range(3) for s in (0, 1)
    ]
    assert counted == seen and {v["tag"] for v in seen} == {"run"}
    for rank in range(3):  # a worker's values arrive in the order it logged them
        assert [v["step"] for v in seen if v["rank"] == rank] == [0, 1]
    executed = []
    executor.execute(lambda counter: _log_twice("execute"), callbacks=[executed.append])
    assert len(executed) == 6 and {v["tag"] for v in executed} == {"execute"}
    # Without callbacks the workers' queue is unset again: log() only warns.
    assert executor.run(_log_twice, args=["none"]) == [0, 1, 2]
    assert len(seen) == 6 and len(executed) == 6


def test_user_subclass_of_base_horovod_worker(ray_local):
    from ray.util.queue import Queue

    from kolo.ray import BaseHorovodWorker

    class Tagged(BaseHorovodWorker):
        def tag(self):
            return f"{self.hostname()}:{os.environ['HOROVOD_RANK']}/{os.environ['HOROVOD_SIZE']}"

    worker = ray.remote(Tagged).remote(world_rank=1, world_size=4)
    assert ray.get(worker.tag.remote()) == f"{socket.gethostname()}:1/4"
    node = ray.get(worker.node_id.remote())
    assert ray.get(worker.env_vars.remote())["HOROVOD_HOSTNAME"] == node
    assert ray.get(worker.execute.remote(lambda executable: executable)) is None
    ray.get(worker.start_executable.remote(dict, None, {"steps": 3}))
    assert ray.get(worker.execute.remote(lambda d: d["steps"])) == 3

    queue = Queue()
    ray.get(worker.set_queue.remote(queue))
    ray.get(worker.execute.remote(_log_to_queue))
    assert queue.get(timeout=10) == {"a": 1}
    ray.kill(worker)
