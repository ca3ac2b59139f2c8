"""Horovod's Keras data modules on 2 ranks under kolorun: NVTabularDataModule.seed_fn() gives
every rank rank 0's seed, and PetastormDataModule gives each rank its own half of the rows
(kolo's rank and size, as Horovod's hvd.rank()/hvd.size())."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from conftest import output_tail, run_kolorun, worker


def test_seed_fn_agrees_and_petastorm_module_shards_by_rank(tmp_path):
    pq.write_table(pa.table({"id": np.arange(40, dtype=np.int64)}), tmp_path / "part-0.parquet")
    result = run_kolorun(
        ["-np", "2", "python", worker("keras_datamodule_worker.py"), str(tmp_path)],
        timeout=240,
        env={"KERAS_BACKEND": "torch"},
    )
    assert result.returncode == 0, output_tail(result)
    found = {
        int(rank): (seed, [int(i) for i in ids.split(",")])
        for rank, seed, ids in re.findall(r"rank (\d): (seed \d+) ids ([\d,]+)", result.stdout)
    }
    assert sorted(found) == [0, 1], result.stdout
    assert found[0][0] == found[1][0]
    rows = found[0][1] + found[1][1]
    assert len(found[0][1]) == 20 and sorted(rows) == list(range(40)), result.stdout
