"""ElasticSampler across a change of size: ``first DIR`` (3 ranks) processes two batches,
commits and writes the sampler state and each rank's indices; ``second DIR`` (2 ranks) loads
that state through a TorchState sync and writes the indices of the rest of the epoch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import kolo.torch as hvd

DATASET = list(range(23))  # not a multiple of 3 or 2
BATCH = 2


def main() -> None:
    phase, out = sys.argv[1], Path(sys.argv[2])
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(DATASET, shuffle=True, seed=7)
    state = hvd.elastic.TorchState(sampler=sampler, epoch=0)
    loader = torch.utils.data.DataLoader(DATASET, batch_size=BATCH, sampler=sampler)
    seen = []
    if phase == "first":
        for batch_idx, batch in enumerate(loader):
            if batch_idx == 2:
                break
            seen += batch.tolist()
            sampler.record_batch(batch_idx, BATCH)
        state.commit()
        if hvd.rank() == 0:
            (out / "state.json").write_text(json.dumps(sampler.state_dict()))
    else:
        if hvd.rank() == 0:
            sampler.load_state_dict(json.loads((out / "state.json").read_text()))
        state.sync()  # every rank takes rank 0's state, split over 2 ranks
        seen = [i for batch in loader for i in batch.tolist()]
    (out / f"{phase}-{hvd.rank()}.json").write_text(json.dumps(seen))
    hvd.shutdown()


if __name__ == "__main__":
    main()
