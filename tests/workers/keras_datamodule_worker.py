"""One rank of tests/test_keras_datamodule_ranks.py: NVTabularDataModule.seed_fn() and the rows
PetastormDataModule gives this rank of the Parquet dataset at argv[1]."""

import sys

import kolo.keras as hvd
from kolo.spark.keras.datamodule import NVTabularDataModule, PetastormDataModule

seed = NVTabularDataModule.seed_fn()  # initializes kolo, as Horovod's does
# cur_shard/shard_count as a single process would pass them: kolo's rank and size win
with PetastormDataModule(
    train_dir=sys.argv[1],
    val_dir=None,
    has_val=False,
    train_batch_size=5,
    cur_shard=0,
    shard_count=1,
    random_seed=3,
) as dm:
    ids = sorted(int(i) for batch in dm.train_data() for i in batch["id"])
print(f"rank {hvd.rank()}: seed {seed} ids {','.join(map(str, ids))}", flush=True)
