"""The GPU a rank trains on, from what its launcher assigned (``kolo._rank_gpu``): the first
assigned address, else ``local_rank``, and ``local_rank`` whenever Horovod's
``*_SPARK_USE_LOCAL_RANK_GPU_INDEX`` asks for it."""

from __future__ import annotations

import pytest

from kolo._rank_gpu import GPU_ADDRESSES_VAR, LOCAL_RANK_GPU_VARS, assigned_gpus, rank_gpu_index


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (GPU_ADDRESSES_VAR, *LOCAL_RANK_GPU_VARS):
        monkeypatch.delenv(name, raising=False)


def test_without_an_assignment_the_gpu_is_the_local_rank() -> None:
    assert assigned_gpus() is None
    assert rank_gpu_index(3) == 3


@pytest.mark.parametrize(
    ("value", "local_rank", "expected"),
    [("5,6", 1, 5), ("2", 0, 2), ("", 1, 1), ("gpu-a", 1, 1)],
)
def test_the_first_assigned_address_wins(
    monkeypatch: pytest.MonkeyPatch, value: str, local_rank: int, expected: int
) -> None:
    monkeypatch.setenv(GPU_ADDRESSES_VAR, value)
    assert assigned_gpus() == [a for a in value.split(",") if a]
    assert rank_gpu_index(local_rank) == expected


@pytest.mark.parametrize("name", LOCAL_RANK_GPU_VARS)
def test_the_local_rank_knob_overrides_the_assignment(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(GPU_ADDRESSES_VAR, "5")
    monkeypatch.setenv(name, "0")
    assert rank_gpu_index(1) == 5
    monkeypatch.setenv(name, "1")
    assert rank_gpu_index(1) == 1
