"""Tensor fusion through shared memory at default settings: batches of mixed shapes and dtypes
are exact on every rank, and a grouped batch runs as one shared-memory collective, flat (2 and 3
ranks, the latter with small halves so every batch takes many rounds) and hierarchical (two
simulated hosts of two ranks); a mismatched tensor in the middle of a batch fails alone and the
next batch is exact; a joined rank's stand-ins leave the other rank's tensors as they were."""

from __future__ import annotations

import json
import re

import pytest

from conftest import output_tail, run_kolorun, worker

LAYOUTS = {
    "shm-2": (2, {"KOLO_TRANSPORT": "shm"}),
    "shm-3-small-halves": (3, {"KOLO_TRANSPORT": "shm", "KOLO_SHM_CHUNK_BYTES": "65536"}),
    "hier-2x2": (4, {"KOLO_TEST_RANKS_PER_HOST": "2"}),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fused_batches_through_shared_memory_are_exact(layout: str) -> None:
    ranks, env = LAYOUTS[layout]
    result = run_kolorun(
        ["-np", str(ranks), "python", worker("shm_fusion_worker.py")], timeout=240, env=env
    )
    assert result.returncode == 0, output_tail(result)
    for rank in range(ranks):
        assert f"[{rank}]<stdout>:rank {rank}: 0 failures" in result.stdout, output_tail(result)
    steps = [json.loads(m) for m in re.findall(r"\[0\]<stdout>:DATA step (\{.*\})", result.stdout)]
    assert len(steps) == 14, output_tail(result)
    # Every collective ran on shared memory.
    assert all(step["shm_collectives"] == step["collectives"] for step in steps), steps
    # Fusion is not capped on shared memory: each dtype's grouped batch (one cycle on every rank
    # for certain; over 1 MiB in float32, float64 and int32, with a tensor of 1.2 MiB or more)
    # ran as one collective at the default 128 MiB threshold. Batches of single ops are only
    # checked for exactness: on a loaded machine they may straddle engine cycles.
    grouped = [step for step in steps if step["grouped"]]
    assert len(grouped) == 4, steps
    assert all(step["collectives"] == 1 and step["fused_tensors"] >= 8 for step in grouped), steps
