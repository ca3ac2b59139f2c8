"""Elastic ``RayExecutor(min_workers=..., max_workers=...)`` on a real multi-node Ray cluster
(``ray.cluster_utils.Cluster``: a 0-CPU head, worker nodes of 1 or 2 CPUs, each a host of its
own): a node added mid-training is a scale-up, a node removed is a loss the others survive,
bad arguments fail before any actor starts, and nothing is left behind.

The training function is full-batch gradient descent with the gradients averaged over the
ranks: every rank computes the same gradient, so the weights after N applied steps do not
depend on the sizes the job went through, and the test compares every worker's final weights
with N steps taken here. A worker that joined without the state sync, or a reset that lost or
repeated a step, would not match.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import time

import pytest
import torch

pytestmark = [pytest.mark.ray]

ray = pytest.importorskip("ray")

from support.ray import ray_cluster  # noqa: E402
from support.shm_segments import leftovers, segments  # noqa: E402

from kolo.exceptions import (  # noqa: E402
    InvalidArgumentError,
    InvalidValueError,
    LaunchError,
    NotSupportedError,
    RankFailedError,
    ResetLimitExceededError,
)
from kolo.exceptions import TimeoutError as KoloTimeoutError  # noqa: E402
from kolo.ray import ElasticRayExecutor, RayExecutor  # noqa: E402
from kolo.ray._hosts import ADDED, NO_UPDATE, REMOVED, HostManager, plan_slots  # noqa: E402

SETTINGS = RayExecutor.create_settings(timeout_s=60, nics=["lo"])
MiB = 1024 * 1024
#: The most steps a training run takes (a run that never sees its node change stops there).
CAP = 600
#: Fast node-death detection (Ray's GCS health check); kolo's own heartbeats are the backstop.
FAST_HEALTH_CHECK = {
    "health_check_failure_threshold": 2,
    "health_check_period_ms": 500,
    "health_check_initial_delay_ms": 0,
}


def _data():

    generator = torch.Generator().manual_seed(7)
    x = torch.randn(64, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.25
    return x, y


def _model():

    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def _step(model, optimizer, x, y, allreduce=None):

    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    if allreduce is not None:
        for parameter in model.parameters():
            parameter.grad = allreduce(parameter.grad)
    optimizer.step()


def _reference(steps: int) -> list[float]:
    """The workers' SGD steps, without torch.optim in this (pytest) process: its first use
    imports torch._dynamo and Triton, whose LLVM aborts a process that already loaded
    TensorFlow's (the suite's Keras tests do)."""
    model = _model()
    x, y = _data()
    for _ in range(steps):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(parameter.grad, alpha=-0.05)
    return [float(v) for v in torch.cat([p.detach().flatten() for p in model.parameters()])]


def _went_through(sizes: list, pattern: list) -> bool:
    """Whether ``sizes`` ends at ``pattern[-1]`` having gone through ``pattern`` in order
    (other sizes between are allowed: two workers may join one after the other)."""
    if not sizes or sizes[-1] != pattern[-1]:
        return False
    found = 0
    for size in sizes:
        if found < len(pattern) and size == pattern[found]:
            found += 1
    return found == len(pattern)


def _train(pattern: list, hold: int, cap: int, pause: float):
    """One worker: trains until the job's sizes went through ``pattern`` (e.g. ``[2, 4]``)
    and ``hold`` more steps ran, or ``cap`` steps. Every rank logs every step."""
    import os

    import kolo.torch as hvd
    from kolo.ray.worker import log

    hvd.init()
    model = _model()
    if os.environ.get("KOLO_TASK_INDEX") != "0":
        with torch.no_grad():  # only the state sync can make a late worker right
            for parameter in model.parameters():
                parameter.add_(float(os.getpid() % 97) + 1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = _data()
    state = hvd.elastic.TorchState(model, optimizer, step=0, held=0, sizes=[])

    def average(tensor):
        return hvd.allreduce(tensor, op=hvd.Average)

    @hvd.elastic.run
    def loop(state):
        while state.step < cap and state.held < hold:
            size = hvd.size()
            _step(state.model, state.optimizer, x, y, average)
            state.step += 1
            if not state.sizes or state.sizes[-1] != size:
                state.sizes = [*state.sizes, size]
            if _went_through(state.sizes, pattern):
                state.held += 1
            log({"step": state.step, "size": size, "rank": hvd.rank(), "pid": os.getpid()})
            time.sleep(pause)
            state.commit()
        weights = torch.cat([p.detach().flatten() for p in state.model.parameters()])
        return {
            "rank": hvd.rank(),
            "size": hvd.size(),
            "step": state.step,
            "sizes": state.sizes,
            "weights": [float(v) for v in weights],
        }

    return loop(state)


@pytest.fixture(scope="module")
def cluster():
    """Two 1-CPU worker nodes to start with; tests add and remove nodes."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with ray_cluster(**FAST_HEALTH_CHECK) as cluster:
        for _ in range(2):
            cluster.add_node(num_cpus=1, object_store_memory=80 * MiB)
        cluster.wait_for_nodes()
        yield cluster


def _kolo_actors() -> list:
    from ray._private import state

    return [
        actor
        for actor in state.actors().values()
        if actor.get("State") != "DEAD"
        and actor.get("ActorClassName", "").endswith(("_RankActor", "Queue", "_QueueActor"))
    ]


@pytest.fixture(autouse=True)
def nothing_left_behind(request):
    """After each test on the cluster: no worker or queue actor alive, no placement group, no
    new kolo shared-memory segment."""
    if "cluster" not in request.fixturenames:
        yield
        return
    before = segments()
    yield
    deadline = time.monotonic() + 15
    while _kolo_actors() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _kolo_actors() == []
    groups = [g for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
    assert groups == []
    assert leftovers(before) == []


def _worker_nodes(cluster) -> list:
    return [node for node in cluster.list_all_nodes() if not node.head]


def _cpus(node) -> int:
    resources = next(n["Resources"] for n in ray.nodes() if n["NodeID"] == node.node_id)
    return int(resources.get("CPU", 0))


def _shape(cluster, *cpus: int) -> list:
    """Makes the worker nodes ``cpus`` (one node per entry, that many CPUs) and returns them in
    that order: nodes already there are kept, others removed or added."""
    wanted = list(cpus)
    kept = []
    for node in _worker_nodes(cluster):
        if _cpus(node) in wanted:
            wanted.remove(_cpus(node))
            kept.append(node)
        else:
            cluster.remove_node(node)
    for count in wanted:
        kept.append(cluster.add_node(num_cpus=count, object_store_memory=80 * MiB))
    cluster.wait_for_nodes()
    deadline = time.monotonic() + 30
    while sum(1 for n in ray.nodes() if n["Alive"]) != len(kept) + 1:
        assert time.monotonic() < deadline, "the cluster did not settle"
        time.sleep(0.2)
    return sorted(kept, key=lambda node: list(cpus).index(_cpus(node)))


def _run_while(executor, args, trigger, action, label: str = "change", timeout: float = 180):
    """Runs ``executor.run(_train, args)`` in a thread (its callback sets ``trigger`` when
    the logged value calls for it) and, here in the main thread (Ray's ``Cluster`` needs it),
    ``action()`` once ``trigger`` says so. Returns the run's results or raises its error, and
    the seconds it took."""
    event = threading.Event()
    outcome: dict = {}

    def on_log(value):
        if not event.is_set() and trigger(value):
            outcome["trigger"] = value
            event.set()
        elif "acted" in outcome and "changed" not in outcome:
            if value["size"] != outcome["trigger"]["size"]:
                outcome["changed"] = time.monotonic()

    def run():
        try:
            outcome["results"] = executor.run(_train, args=args, callbacks=[on_log])
        except BaseException as error:
            outcome["error"] = error

    began = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not event.wait(0.1):
        assert thread.is_alive(), f"the run ended before its trigger: {outcome}"
        assert time.monotonic() < deadline, "the trigger never came"
    action(outcome["trigger"])
    outcome["acted"] = time.monotonic()
    thread.join(max(1.0, deadline - time.monotonic()))
    assert not thread.is_alive(), "the run did not end"
    elapsed = time.monotonic() - began
    executor.shutdown()
    if "changed" in outcome:
        print(
            f"\n{label}: first step at the new size "
            f"{outcome['changed'] - outcome['acted']:.2f} s after it (callback delivery included)"
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["results"], elapsed


def _check_results(results: list[dict], final_size: int) -> None:
    assert [r["rank"] for r in results] == list(range(final_size)), results
    steps = {r["step"] for r in results}
    assert len(steps) == 1, results
    expected = _reference(steps.pop())
    for result in results:
        assert result["size"] == final_size
        assert result["weights"] == pytest.approx(expected, abs=1e-5), result


def test_scales_up_when_a_node_is_added(cluster, caplog):
    _shape(cluster, 1, 1)
    executor = RayExecutor(SETTINGS, min_workers=2, max_workers=4, elastic_timeout=60)
    executor.start()
    # One node with two slots: the job goes from 2 to 4 workers at once (2 on the new node).
    with caplog.at_level(logging.INFO, logger="kolo.ray"):
        results, elapsed = _run_while(
            executor,
            [[2, 4], 5, CAP, 0.05],
            lambda v: v["size"] == 2 and v["step"] >= 3,
            lambda _: cluster.add_node(num_cpus=2, object_store_memory=80 * MiB),
            "node added",
        )
    print(f"\nscale-up run: {elapsed:.1f} s, round sizes {executor.elastic_round_sizes}")
    _check_results(results, 4)
    assert results[0]["sizes"][0] == 2 and results[0]["sizes"][-1] == 4, results[0]["sizes"]
    assert executor.elastic_round_sizes[0] == 2 and executor.elastic_round_sizes[-1] == 4
    rounds = [r.getMessage() for r in caplog.records if "round" in r.getMessage()]
    assert any("size 2 on 2 node(s)" in m for m in rounds), rounds
    assert any("size 4 on 3 node(s)" in m for m in rounds), rounds


def test_survives_the_removal_of_a_node(cluster):
    victim = _shape(cluster, 2, 1, 1)[0]
    executor = RayExecutor(SETTINGS, min_workers=2, max_workers=4, elastic_timeout=60)
    executor.start()
    # Its raylet and both workers on it killed at once (SIGKILL: no goodbye to anyone).
    results, elapsed = _run_while(
        executor,
        [[4, 2], 5, CAP, 0.05],
        lambda v: v["size"] == 4 and v["step"] >= 3,
        lambda _: cluster.remove_node(victim, allow_graceful=False),
        "node removed",
    )
    print(f"\nnode-loss run: {elapsed:.1f} s, round sizes {executor.elastic_round_sizes}")
    _check_results(results, 2)
    assert results[0]["sizes"][0] == 4 and results[0]["sizes"][-1] == 2, results[0]["sizes"]


def test_a_failing_host_is_blacklisted_then_retried_after_its_cooldown(cluster):
    _shape(cluster, 1, 1)
    executor = RayExecutor(
        SETTINGS, min_workers=1, max_workers=2, cooldown_range=(1, 2), elastic_timeout=60
    )
    executor.start()
    # kill -9 of rank 1's process (its node stays): the host is blacklisted, the job goes on
    # with one worker, and once the cooldown ends a new worker joins on that host again.
    results, elapsed = _run_while(
        executor,
        [[2, 1, 2], 5, CAP, 0.05],
        lambda v: v["size"] == 2 and v["rank"] == 1 and v["step"] >= 3,
        lambda value: os.kill(value["pid"], signal.SIGKILL),
        "kill -9",
    )
    print(f"\ncooldown run: {elapsed:.1f} s, round sizes {executor.elastic_round_sizes}")
    _check_results(results, 2)
    assert results[0]["sizes"][-3:] == [2, 1, 2], results[0]["sizes"]


def test_fewer_than_min_workers_for_elastic_timeout_is_a_clear_error(cluster):
    nodes = _shape(cluster, 1, 1)
    executor = RayExecutor(SETTINGS, min_workers=2, max_workers=2, elastic_timeout=3)
    executor.start()
    with pytest.raises(
        KoloTimeoutError, match=r"only 1 worker.*min_workers=2.*elastic_timeout=3 s"
    ):
        _run_while(
            executor,
            [[99], 1, CAP, 0.05],
            lambda v: v["step"] >= 2,
            lambda _: cluster.remove_node(nodes[-1], allow_graceful=False),
        )


def test_reset_limit_exceeded_stops_the_job(cluster):
    nodes = _shape(cluster, 1, 1)
    executor = RayExecutor(SETTINGS, min_workers=1, max_workers=4, reset_limit=0)
    executor.start()
    with pytest.raises(ResetLimitExceededError) as raised:
        _run_while(
            executor,
            [[99], 1, CAP, 0.05],
            lambda v: v["step"] >= 2,
            lambda _: cluster.remove_node(nodes[-1], allow_graceful=False),
        )
    assert raised.value.limit == 0


def test_shutdown_during_a_run_stops_it_and_leaves_nothing(cluster):
    _shape(cluster, 1, 1)
    executor = RayExecutor(SETTINGS, min_workers=1, max_workers=2)
    executor.start()
    began = time.monotonic()
    with pytest.raises(LaunchError, match="shutdown"):
        _run_while(
            executor,
            [[99], 1, CAP, 0.05],
            lambda v: v["step"] >= 2,
            lambda _: executor.shutdown(),
        )
    assert time.monotonic() - began < 60
    assert executor.workers == []


def test_start_waits_for_min_workers_slots_then_names_both_numbers(cluster):
    executor = RayExecutor(SETTINGS, min_workers=50, elastic_timeout=1.5)
    began = time.monotonic()
    with pytest.raises(KoloTimeoutError, match=r"only \d+ worker slot.*min_workers=50"):
        executor.start()
    assert 1.5 <= time.monotonic() - began < 10


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_workers": 4}, InvalidValueError, "without any positive `min_workers`"),
        ({"min_workers": 2, "num_workers": 2}, InvalidValueError, "Both `min_workers`"),
        ({"min_workers": 2, "num_hosts": 2}, InvalidValueError, "Both `min_workers`"),
        ({"min_workers": 0}, InvalidValueError, "`min_workers` must be an int >= 1"),
        ({"min_workers": 3, "max_workers": 2}, InvalidValueError, r"`max_workers` \(2\)"),
        ({"min_workers": 1.5}, InvalidValueError, "`min_workers` must be an int"),
        ({"min_workers": 1, "reset_limit": -1}, InvalidValueError, "`reset_limit`"),
        ({"min_workers": 1, "elastic_timeout": 0}, InvalidValueError, "`elastic_timeout`"),
        ({"min_workers": 1, "cooldown_range": (0, 10)}, InvalidValueError, "cooldown_range"),
        ({"min_workers": 1, "cooldown_range": (10, 5)}, InvalidValueError, "cooldown_range"),
        ({"min_workers": 1, "cooldown_range": (1, 4000)}, InvalidValueError, "cooldown_range"),
        ({"min_workers": 1, "cooldown_range": 10}, InvalidValueError, "pair"),
        ({"min_workers": 1, "gpus_per_worker": 1}, InvalidValueError, "use_gpu is False"),
        ({"min_workers": 1, "cpus_per_worker": 0}, InvalidValueError, "`cpus_per_worker`"),
        ({"min_workers": 1, "override_discovery": False}, InvalidValueError, "settings.discovery"),
    ],
)
def test_bad_arguments_are_typed_errors_before_any_actor(cluster, kwargs, error, match):
    before = len(_kolo_actors())
    with pytest.raises(error, match=match):
        RayExecutor(SETTINGS, **kwargs)
    assert len(_kolo_actors()) == before == 0


def test_elastic_mode_refuses_what_needs_fixed_workers(cluster):
    executor = RayExecutor(SETTINGS, min_workers=1)
    with pytest.raises(NotSupportedError, match="run_remote"):
        executor.run_remote(lambda: 1)
    with pytest.raises(NotSupportedError, match="execute_single"):
        executor.execute_single(lambda _: 1)
    with pytest.raises(InvalidValueError, match="use_gpu is False"):
        ElasticRayExecutor(ElasticRayExecutor.create_settings(), gpus_per_slot=1)
    with pytest.raises(InvalidArgumentError, match="unknown argument"):
        ElasticRayExecutor.create_settings(min_num_proc=1, hosts="a:1")


class Counter:
    """An executable each elastic worker builds from ``start(executable_cls=...)``."""

    def __init__(self, start):
        self.value = start

    def bump(self):
        import kolo.torch as hvd

        hvd.init()
        self.value += 1
        return hvd.rank(), hvd.size(), self.value, os.environ["KOLO_RAY_NODE_ID"]


def _raise_value_error():
    import kolo.torch as hvd

    hvd.init()
    raise ValueError(f"bad input on rank {hvd.rank()}")


def test_execute_builds_the_executable_on_the_hosts_of_a_discovery_of_ones_own(cluster):
    first, _ = _shape(cluster, 1, 1)
    discovery = _Hosts()
    discovery.slots = {first.node_id: 1}  # the second node exists, but is not the job's
    settings = dataclasses.replace(SETTINGS, discovery=discovery)
    executor = RayExecutor(settings, min_workers=1, max_workers=2, override_discovery=False)
    executor.start(executable_cls=Counter, executable_args=[10])
    assert executor.execute(lambda counter: counter.bump()) == [(0, 1, 11, first.node_id)]
    executor.shutdown()


def test_elastic_ray_executor_fails_the_run_when_every_worker_raises(cluster):
    _shape(cluster, 1, 1)
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=4, timeout_s=60)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    # Every worker raises: each is removed and its host blacklisted; with none left the run
    # raises the first failure with its traceback (no hang, no retry on blacklisted hosts).
    began = time.monotonic()
    with pytest.raises(RankFailedError, match="every worker failed") as raised:
        executor.run(_raise_value_error)
    assert "ValueError: bad input on rank" in raised.value.remote_traceback
    assert time.monotonic() - began < 60
    executor.shutdown()


class _Hosts:
    """A discovery whose answer the test sets."""

    def __init__(self):
        self.slots: dict = {}

    def find_available_hosts_and_slots(self):
        return dict(self.slots)


def test_host_order_and_slot_plan_follow_horovod():
    discovery = _Hosts()
    hosts = HostManager(discovery)
    discovery.slots = {"b": 2, "a": 1}
    assert hosts.update() == ADDED
    discovery.slots = {"c": 1, "a": 1, "b": 2}
    assert hosts.update() == ADDED
    assert hosts.available() == [("b", 2), ("a", 1), ("c", 1)]  # older hosts first
    assert hosts.update() == NO_UPDATE
    discovery.slots = {"c": 1, "b": 1}
    assert hosts.update() == REMOVED
    discovery.slots = {"c": 1, "b": 1, "a": 3}
    assert hosts.update() == ADDED
    assert hosts.available() == [("b", 1), ("c", 1), ("a", 3)]  # "a" came back: it is new
    assert plan_slots(hosts.available(), 4) == {"b": 1, "c": 1, "a": 2}
    assert plan_slots(hosts.available(), None) == {"b": 1, "c": 1, "a": 3}


def test_blacklist_is_permanent_without_cooldown_and_doubles_with_one():
    now = [1000.0]
    discovery = _Hosts()
    discovery.slots = {"a": 1, "b": 1}
    forever = HostManager(discovery, None, clock=lambda: now[0])
    forever.update()
    forever.blacklist("b")
    now[0] += 10_000
    assert forever.update() == NO_UPDATE and forever.available() == [("a", 1)]

    hosts = HostManager(discovery, (10.0, 100.0), clock=lambda: now[0])
    hosts.update()
    cooldowns = []
    for _ in range(3):
        start = now[0]
        hosts.blacklist("b")
        assert hosts.available() == [("a", 1)] and hosts.update() == NO_UPDATE
        while hosts.update() == NO_UPDATE:
            now[0] += 0.5
        assert hosts.available() == [("a", 1), ("b", 1)]
        cooldowns.append(now[0] - start)
    # lower * 2**n + uniform(0, 1) * lower, clamped to [lower, upper]: 20-30 s, 40-50 s, 80-90 s.
    assert 20 <= cooldowns[0] <= 30.5 and 40 <= cooldowns[1] <= 50.5 and 80 <= cooldowns[2] <= 90.5
