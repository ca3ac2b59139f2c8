"""``ParquetLoader``: a rank's shuffled, equal-size share of a Parquet dataset as batches of
torch tensors or numpy arrays, read and assembled on background threads in Rust.

Every rank gets the same number of rows per epoch, so every rank runs the same number of
steps. Row groups are shuffled per epoch and rows within windows of ``shuffle_buffer_size``
rows; both follow ``(seed, epoch)``, so all ranks agree without talking to each other.

Example::

    import kolo.torch as hvd
    from kolo.data import ParquetLoader

    hvd.init()
    loader = ParquetLoader("s3://bucket/train", ["features", "label"], batch_size=256)
    for epoch in range(10):
        for batch in loader:  # one epoch
            train_step(batch["features"], batch["label"])
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from kolo import _core, _native
from kolo.data.data_loader_base import BaseDataLoader
from kolo.data.metadata import dataset_location
from kolo.exceptions import InvalidValueError

__all__ = ["ParquetLoader"]


class ParquetLoader(BaseDataLoader):
    """Iterates batches (dicts column → tensor) of this rank's share of a Parquet dataset.

    Args:
        dataset: a directory/prefix of Parquet files (Spark's output: ``part-*`` files;
            ``_SUCCESS``, ``.crc`` and other ``_``/``.`` names are skipped) or one file; a
            local path, a store URL (``s3://``, ``gs://``, ``az://``, ``hdfs://``,
            ``dbfs:/``), or a store object with ``prefix_path`` and ``storage_options``.
        columns: the columns to load: numeric or boolean scalars, or fixed-length arrays of
            them (``[batch, len]`` tensors).
        batch_size: rows per batch.
        rank: this rank; default ``hvd.rank()`` when kolo is initialized, else 0.
        size: the number of ranks; default ``hvd.size()`` when kolo is initialized, else 1.
        shuffle: shuffle row groups and rows (within ``shuffle_buffer_size`` windows).
        seed: seed of every shuffle; epoch ``e`` uses ``(seed, e)``.
        num_epochs: None: each ``for`` loop over the loader runs one epoch, without end.
            A number: one ``for`` loop runs the remaining epochs up to that many.
        drop_last: True: each rank gets ``floor(rows / size)`` rows and whole batches only.
            False: ``ceil(rows / size)`` rows (the last ranks wrap around to the first rows)
            and a final partial batch, of the same size on every rank.
        prefetch: batches kept ready on the background threads.
        to: ``"torch"`` (tensors) or ``"numpy"`` (arrays).
        storage_options: store options (``aws_endpoint``, ``google_service_account``, ...).
        shuffle_buffer_size: rows per shuffle window (default ``max(16384, 4 * batch_size)``).
        num_threads: decode threads, and as many threads (at most one per CPU) gathering
            shuffle windows ahead (default ``min(4, CPUs)``).
        stack: None: one tensor per column. A name: the scalar columns sharing the dtype of
            the first selected scalar column come out as one ``[rows, columns]`` tensor
            under that name (columns in selection order; copied row-major on the loader's
            threads), the others under their own names. One tensor instead of one per
            column is much cheaper per batch with many columns, and is the feature matrix
            a model takes: ``ParquetLoader(path, features + ["label"], 256, stack="features")``
            gives ``{"features": [256, len(features)], "label": [256]}``.

    ``state_dict()``/``load_state_dict()`` save and restore the position (rows handed out,
    not prefetched), also into a loader with another number of ranks: it then hands out
    exactly the rows of the epoch that no rank had handed out yet.

    It is a Horovod :class:`~kolo.data.BaseDataLoader` (``_iterate()`` yields one epoch), so
    ``class AsyncParquetLoader(AsyncDataLoaderMixin, ParquetLoader)`` reads it on a Python
    thread as Horovod's async loaders do.
    """

    def __init__(
        self,
        dataset: Union[str, os.PathLike, Any],
        columns: Union[str, Sequence[str]],
        batch_size: int,
        rank: Optional[int] = None,
        size: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        num_epochs: Optional[int] = None,
        drop_last: bool = True,
        prefetch: int = 2,
        to: str = "torch",
        *,
        storage_options: Optional[Mapping[str, str]] = None,
        shuffle_buffer_size: Optional[int] = None,
        num_threads: Optional[int] = None,
        stack: Optional[str] = None,
    ) -> None:
        if to not in ("torch", "numpy"):
            raise InvalidValueError(f'to={to!r} must be "torch" or "numpy"')
        if stack is not None and (not isinstance(stack, str) or not stack):
            raise InvalidValueError(
                f"stack={stack!r} must be None or the name of the stacked tensor, "
                'e.g. stack="features"'
            )
        self._torch = None
        if to == "torch":
            import torch

            self._torch = torch
        columns = _column_names(columns)
        if stack is not None and stack in columns:
            raise InvalidValueError(
                f"stack={stack!r} is also a selected column's name; name the stacked tensor "
                "something else, e.g. stack='features'"
            )
        initialized = _core.is_initialized()
        if rank is None:
            rank = _core.rank() if initialized else 0
        if size is None:
            size = _core.size() if initialized else 1
        location, options = dataset_location(dataset, storage_options)
        self._num_epochs = num_epochs
        self._core = _native.ParquetLoaderCore(
            location,
            columns,
            int(batch_size),
            int(rank),
            int(size),
            bool(shuffle),
            int(seed),
            bool(drop_last),
            int(prefetch),
            options,
            None if shuffle_buffer_size is None else int(shuffle_buffer_size),
            None if num_threads is None else int(num_threads),
            None if num_epochs is None else int(num_epochs),
            stack is not None,
        )
        self._stack = stack
        self._stack_group = self._core.stack_group
        self._layout = [(names, length is None) for names, _, length in self._core.layout]
        if stack is not None:
            stacked = set(self._layout[self._stack_group][0])
            keys = [stack] + [c for c in columns if c not in stacked]
        else:
            keys = columns
        self._names = [
            stack if i == self._stack_group else name
            for i, (names, _) in enumerate(self._layout)
            for name in (names[:1] if i == self._stack_group else names)
        ]
        self._order = keys if self._names != keys else None
        # Kept here: len() from another thread while next_batch() runs (an async loader)
        # must not borrow the native loader (PyO3 raises "Already mutably borrowed").
        self._batches_per_epoch = int(self._core.batches_per_epoch)

    def __len__(self) -> int:
        """Batches per epoch (the same on every rank)."""
        return self._batches_per_epoch

    @property
    def rows_per_epoch(self) -> int:
        """Rows this rank hands out per epoch."""
        return int(self._core.rows_per_epoch)

    @property
    def bytes_copied(self) -> int:
        """Bytes the loader has written since it was built: values decoded, decompressed or
        fetched, shuffle windows gathered (a ``stack`` tensor twice: gathered, then
        transposed) and batches copied across two windows. Plain, uncompressed local files
        are read where they lie in the mapped file, so an epoch costs one pass over the
        bytes of the rows it gathers::

            loader = ParquetLoader(path, ["features", "label"], batch_size=4096)
            for batch in loader:
                pass
            print(loader.bytes_copied / loader.rows_per_epoch)  # bytes per row
        """
        return int(self._core.bytes_copied)

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return int(self._core.epoch)

    @property
    def shuffle_buffer_size(self) -> int:
        """Rows per shuffle window."""
        return int(self._core.shuffle_buffer_size)

    @property
    def url(self) -> str:
        """The dataset's URL."""
        return str(self._core.url)

    def _iterate(self) -> Iterator[Dict[str, Any]]:
        core = self._core
        convert = self._convert
        while True:
            views = core.next_batch()
            if views is None:
                if self._num_epochs is None or core.finished:
                    return
                continue
            yield convert(views)

    def _convert(self, views: tuple) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        torch = self._torch
        stack_group = self._stack_group
        for index, ((names, stacked), view) in enumerate(zip(self._layout, views)):
            array = np.asarray(view)
            if index == stack_group:
                out[self._stack] = array if torch is None else torch.from_numpy(array)
            elif stacked and len(names) == 1:
                # One scalar column ([1, rows]): numpy's row view is far cheaper per batch
                # than torch's unbind.
                out[names[0]] = array[0] if torch is None else torch.from_numpy(array[0])
            elif torch is not None:
                tensor = torch.from_numpy(array)
                if stacked:
                    out.update(zip(names, tensor.unbind(0)))
                else:
                    out[names[0]] = tensor
            elif stacked:
                out.update(zip(names, array))
            else:
                out[names[0]] = array
        if self._order is not None:
            out = {name: out[name] for name in self._order}
        return out

    def state_dict(self) -> Dict[str, Any]:
        """The position: epoch, rows of it handed out (``offset``), seed and the settings
        that shape the plan, and the dataset's fingerprint. Save it with the model."""
        return json.loads(self._core.state_json())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from ``state``: exactly where it stood when size, batch size,
        ``drop_last`` and ``shuffle_buffer_size`` match, else the rest of its epoch spread
        over this loader's ranks. Raises :class:`~kolo.exceptions.DataError` if the dataset
        changed since."""
        self._core.load_state_json(json.dumps(dict(state)))

    def close(self) -> None:
        """Stops the background threads (iterating again restarts them)."""
        self._core.close()

    def __enter__(self) -> ParquetLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ParquetLoader({self.url!r}, batches_per_epoch={len(self)}, "
            f"epoch={self.epoch}, columns={self._names!r})"
        )


def _column_names(columns: Any) -> list[str]:
    """``columns`` (a name or names) as a list of names, or a typed error."""
    if isinstance(columns, str):
        return [columns]
    if isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns):
        return list(columns)
    raise InvalidValueError(
        f"columns={columns!r} must be a column name or a list of column names, "
        "e.g. columns=['features', 'label']"
    )
