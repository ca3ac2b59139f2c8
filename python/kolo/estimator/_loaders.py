"""The loaders a rank trains from, around :class:`kolo.data.ParquetLoader`, for Horovod's loader
parameters: :class:`CachedLoader` (``inmemory_cache_all``), :class:`DebugLoader`
(``debug_data_loader``) and :class:`DataModuleLoader` (the batches of a user's ``data_module``).
Each has the loader interface the rank loops use: ``len()`` (batches per epoch), iteration (one
epoch), ``state_dict()``/``load_state_dict()`` and ``close()``.

Example::

    loader = CachedLoader(ParquetLoader(path, ["x", "y"], batch_size=32), 32, True, seed=0)
    for epoch in range(3):
        for batch in loader:      # epoch 0 reads the store, epochs 1 and 2 memory
            ...
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

log = logging.getLogger(__name__)


def _concat(parts: List[Any]) -> Any:
    """The rows of ``parts`` (torch tensors or numpy arrays) in one tensor/array."""
    import numpy as np

    first = parts[0]
    if type(first).__module__.startswith("torch"):
        import torch

        return torch.cat(parts)
    return np.concatenate(parts)


class CachedLoader:
    """A loader that keeps the rows of its first full epoch in memory and serves later epochs
    from there, reshuffled every epoch when ``shuffle`` (Horovod's ``inmemory_cache_all``).

    Example::

        train = CachedLoader(loader, batch_size=32, shuffle=True, seed=0)
    """

    def __init__(self, loader: Any, batch_size: int, shuffle: bool, seed: int) -> None:
        self.loader = loader
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = seed
        self._rows: Optional[Dict[str, Any]] = None
        self._epoch = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        if self._rows is None:
            yield from self._read_and_cache()
            return
        import numpy as np

        self._epoch += 1
        rows = len(next(iter(self._rows.values())))
        if self.shuffle:
            order = np.random.default_rng((self.seed, self._epoch)).permutation(rows)
        else:
            order = np.arange(rows)
        for start in range(0, rows, self.batch_size):
            index = order[start : start + self.batch_size]
            yield {name: self._take(values, index) for name, values in self._rows.items()}

    def _read_and_cache(self) -> Iterator[Dict[str, Any]]:
        batches = []
        for batch in self.loader:
            batches.append(batch)
            if len(batches) == len(self.loader):  # a whole epoch: keep it
                self._rows = {name: _concat([b[name] for b in batches]) for name in batch}
            yield batch

    @staticmethod
    def _take(values: Any, index: Any) -> Any:
        if type(values).__module__.startswith("torch"):
            import torch

            return values[torch.from_numpy(index)]
        return values[index]

    def state_dict(self) -> Dict[str, Any]:
        """The underlying loader's position."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores the underlying loader's position."""
        self.loader.load_state_dict(state)

    def close(self) -> None:
        """Closes the underlying loader and drops the cache."""
        self._rows = None
        self.loader.close()


class DebugLoader:
    """A loader that logs, for every batch, its columns' shapes and how long the rank waited
    for it (Horovod's ``debug_data_loader``).

    Example::

        train = DebugLoader(loader, "train", rank=0)
    """

    def __init__(self, loader: Any, name: str, rank: int) -> None:
        self.loader = loader
        self.name = name
        self.rank = rank

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        source = iter(self.loader)
        step = 0
        while True:
            started = time.monotonic()
            try:
                batch = next(source)
            except StopIteration:
                return
            waited_ms = (time.monotonic() - started) * 1000
            items = batch.items() if isinstance(batch, Mapping) else ()
            shapes = {k: tuple(getattr(v, "shape", ())) for k, v in items}
            log.info(
                "rank %d %s loader batch %d: waited %.1f ms, %s",
                self.rank,
                self.name,
                step,
                waited_ms,
                shapes,
            )
            step += 1
            yield batch

    def state_dict(self) -> Dict[str, Any]:
        """The underlying loader's position."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores the underlying loader's position."""
        self.loader.load_state_dict(state)

    def close(self) -> None:
        """Closes the underlying loader."""
        self.loader.close()


class DataModuleLoader:
    """``steps`` batches per epoch from one of a data module's endless iterables
    (``dm.train_data()``/``dm.val_data()``, as Horovod's torch and Keras ranks read them);
    ``close`` runs ``on_close`` (leaving the data module). Its position is not checkpointed.

    Example::

        train = DataModuleLoader(dm.train_data(), steps=100, on_close=lambda: None)
    """

    def __init__(self, iterable: Any, steps: int, on_close: Optional[Callable[[], None]]) -> None:
        self.source = iter(iterable)
        self.steps = steps
        self.on_close = on_close

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.steps):
            yield next(self.source)

    def state_dict(self) -> Dict[str, Any]:
        """Empty: a data module's position is its own."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore (see :meth:`state_dict`)."""

    def close(self) -> None:
        """Leaves the data module (once)."""
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            on_close()
