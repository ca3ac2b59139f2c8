"""Horovod's ``ElasticSampler``: a ``DistributedSampler`` that remembers how far the epoch got
and, after a reset, splits only the samples not yet processed among the new set of ranks."""

from __future__ import annotations

import math
import random
from typing import Any, Iterator

import torch.utils.data

from kolo import _core

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Splits a dataset among the ranks, and re-splits what is left of the epoch after a reset.

    Every rank orders the indices the same way (shuffled with ``seed + epoch``); rank ``r`` of
    ``n`` takes every ``n``-th of the indices not yet processed, starting at ``r`` (padded by
    repeating the first ones so every rank gets the same count). Track the sampler in a
    ``TorchState``, call :meth:`record_batch` after each batch and :meth:`set_epoch` at the
    *end* of each epoch: after a reset the ranks continue with exactly the indices no rank has
    processed this epoch.

    Args:
        dataset: the dataset (its length must not change).
        shuffle: shuffle the indices every epoch (default ``True``).
        seed: shuffling seed, the same on every rank (default 0).

    Example::

        sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)
        loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
        state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)
        for batch_idx, batch in enumerate(loader):
            ...
            state.sampler.record_batch(batch_idx, 32)
        sampler.set_epoch(state.epoch + 1)
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed

        self.epoch = 0
        self.processed_num = 0

        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0

        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch``: a new order (when shuffling) and nothing processed yet. Call
        it at the end of an epoch, so a reset inside an epoch does not repeat samples.

        Example::

            sampler.set_epoch(epoch + 1)
        """
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Records that every rank processed one more batch of ``batch_size`` samples.

        Example::

            sampler.record_batch(batch_idx, batch_size)
        """
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict[str, int]:
        """The epoch and the number of samples processed in it.

        Example::

            saved = sampler.state_dict()  # {"epoch": 2, "processed_num": 640}
        """
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Continues from a :meth:`state_dict`, split among the current ranks.

        Example::

            sampler.load_state_dict(saved)
        """
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Re-reads rank and size and re-splits the indices not processed this epoch.

        Example::

            sampler.reset()  # after hvd.shutdown(); hvd.init()
        """
        self.num_replicas = _core.size()
        self.rank = _core.rank()

        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num :]

        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = self.remaining_indices[:]
        while indices and len(indices) < self.total_size:
            # Pad with the first indices so every rank gets num_samples (cycling when fewer
            # remain than there are ranks).
            indices += indices[: self.total_size - len(indices)]
        self.indices = indices[self.rank : self.total_size : self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
