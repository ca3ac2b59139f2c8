"""Ray fixtures: one local Ray instance for the session (127.0.0.1, no dashboard), and a helper
for modules that need a multi-node ``ray.cluster_utils.Cluster`` of their own."""

from __future__ import annotations

import contextlib

import pytest

#: How ``ray_local`` starts Ray (also used to start it again after a module's own cluster).
LOCAL_RAY_ARGS = dict(
    num_cpus=8,
    include_dashboard=False,
    _node_ip_address="127.0.0.1",
    object_store_memory=200 * 1024 * 1024,
    logging_level="ERROR",
)


@pytest.fixture(scope="session")
def ray_local():
    """A single-node Ray instance with 8 logical CPUs, shared by the session's Ray tests."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(**LOCAL_RAY_ARGS)
    yield ray
    ray.shutdown()


@contextlib.contextmanager
def ray_cluster(head_cpus: int = 0, **system_config):
    """A ``ray.cluster_utils.Cluster`` on this machine (its head with ``head_cpus`` CPUs and
    ``system_config`` as Ray's ``_system_config``), this process connected to it as driver.
    The session's ``ray_local`` instance, when it was running, is shut down first and started
    again afterwards."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    was_local = ray.is_initialized()
    if was_local:
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": head_cpus,
            "include_dashboard": False,
            "object_store_memory": 80 * 1024 * 1024,
            "_system_config": system_config,
        },
    )
    try:
        ray.init(address=cluster.address, logging_level="ERROR")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if was_local:
            ray.init(**LOCAL_RAY_ARGS)
