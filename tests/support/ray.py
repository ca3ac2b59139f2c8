"""Ray fixtures: one local Ray instance for the session (127.0.0.1, no dashboard)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_local():
    """A single-node Ray instance with 8 logical CPUs, shared by the session's Ray tests."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(
            num_cpus=8,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            object_store_memory=200 * 1024 * 1024,
            logging_level="ERROR",
        )
    yield ray
    ray.shutdown()
