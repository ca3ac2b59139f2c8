"""One rank of an elastic Lightning fit through ``KoloStrategy`` (``kolo.lightning.elastic``):
tests/test_elastic_frameworks.py starts 3 of these under an elastic driver and SIGKILLs one
mid-epoch.

Lightning injects a shuffling ``DistributedSampler`` for the current number of ranks into
every fit, so each epoch splits the 48 rows among the ranks of the round that ran it. Every
rank prints ``batch <epoch> <batch> <size>`` after each batch (sleeping ``SLOW`` seconds, so a
kill lands mid-epoch), and at the end ``result <json>``: epochs and optimizer steps done, each
round's first epoch and size, the weights, and their largest difference from a one-process
reference that trains each epoch on the rows of that epoch's ranks together (plain PyTorch,
one optimizer throughout: it matches only if the resumed fits restarted from the committed
weights, momentum and epoch).

With ``HOLD_UNTIL_SIZE=N``, ranks of a smaller round wait at the end of each epoch (after its
commit, up to 120 s) until the interrupt for the rank being added came: the driver announces a
new rank once it registered, and the fit could otherwise end before it starts.
"""

from __future__ import annotations

import json
import os
import time
import warnings

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import kolo.torch as hvd
from kolo.lightning import KoloStrategy, elastic

ROWS = 48
BATCH = 4
EPOCHS = 4
LR = 0.05
MOMENTUM = 0.9
SLOW = 0.1
HOLD_UNTIL_SIZE = int(os.environ.get("HOLD_UNTIL_SIZE", "0"))
HOLD_FOR = 120.0
#: The elastic state, for the hold at epoch ends (set by main).
STATE: list = []
torch.set_default_dtype(torch.float64)
warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*LeafSpec.*")


class Net(pl.LightningModule):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self(x), y)

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        print(f"batch {self.current_epoch} {batch_idx} {hvd.size()}", flush=True)
        time.sleep(SLOW)

    def on_train_epoch_end(self) -> None:
        # After the epoch's commit (callbacks run first); a global op lets the check see the
        # driver's news.
        deadline = time.monotonic() + HOLD_FOR
        while hvd.size() < HOLD_UNTIL_SIZE and time.monotonic() < deadline:
            hvd.barrier()
            STATE[0].check_host_updates()
            time.sleep(0.02)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    return TensorDataset(torch.randn(ROWS, 4, generator=g), torch.randn(ROWS, 3, generator=g))


def reference(sizes: list[int]) -> dict[str, torch.Tensor]:
    """One process, one optimizer: epoch ``e`` steps on the rows ``sizes[e]`` ranks had
    together at each step (the averaged gradient of equal batches is their union's)."""
    model = Net(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = data().tensors
    for epoch, size in enumerate(sizes):
        # The order of Lightning's DistributedSampler (shuffled, seed 0, set_epoch(epoch)).
        order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(epoch)).tolist()
        per_rank = [order[r::size] for r in range(size)]
        for k in range(len(per_rank[0]) // BATCH):
            rows = [i for r in range(size) for i in per_rank[r][k * BATCH : (k + 1) * BATCH]]
            opt.zero_grad()
            F.mse_loss(model(x[rows]), y[rows]).backward()
            opt.step()
    return model.state_dict()


def main() -> None:
    hvd.init()
    model = Net(seed=hvd.rank())  # different weights on each rank until the sync
    state = elastic.LightningState(model)
    STATE.append(state)
    rounds = []
    fits = []

    @elastic.run
    def train(state):
        rounds.append([state.epoch, hvd.size()])
        trainer = pl.Trainer(
            strategy=KoloStrategy(),
            accelerator="cpu",
            devices=1,
            max_epochs=EPOCHS,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[elastic.CommitStateCallback(state)],
        )
        fits.append(trainer)
        trainer.fit(state.model, DataLoader(data(), batch_size=BATCH), ckpt_path=state.ckpt_path)
        return trainer

    trainer = train(state)
    # No rank leaves while another is still in its last commit (a rank that left ends the round).
    hvd.barrier()
    sizes = []
    for i, (start, size) in enumerate(rounds):
        end = rounds[i + 1][0] if i + 1 < len(rounds) else EPOCHS
        sizes += [size] * (end - start)
    expected = reference(sizes)
    weights = state.model.state_dict()
    result = dict(
        rank=hvd.rank(),
        size=hvd.size(),
        epochs=trainer.current_epoch,
        global_step=trainer.global_step,
        rounds=rounds,
        epoch_sizes=sizes,
        reference_max_diff=max((weights[k] - expected[k]).abs().max().item() for k in expected),
        weights={k: v.tolist() for k, v in weights.items()},
    )
    print("result " + json.dumps(result), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
