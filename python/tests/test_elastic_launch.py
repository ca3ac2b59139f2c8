"""``kolo._env.elastic_launch``: which environments mark a worker of an elastic job
(``DistributedOptimizer`` then registers its hooks on one rank, as Horovod's does)."""

from __future__ import annotations

import pytest

from kolo._env import elastic_launch

NAMES = ("KOLO_ELASTIC_TIMEOUT", "KOLO_ELASTIC", "HOROVOD_ELASTIC")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, False),
        ({"KOLO_ELASTIC_TIMEOUT": "600"}, True),
        ({"KOLO_ELASTIC_TIMEOUT": " "}, False),
        ({"KOLO_ELASTIC": "1"}, True),
        ({"HOROVOD_ELASTIC": "1"}, True),
        ({"HOROVOD_ELASTIC": "0"}, False),
    ],
)
def test_elastic_launch_reads_the_launchers_variables(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: bool
) -> None:
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert elastic_launch() is expected
