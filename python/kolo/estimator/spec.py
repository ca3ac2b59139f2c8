"""What a rank needs to train, whatever the framework: :class:`TrainingSpec`, the base of the
framework specs (:class:`~kolo.estimator.torch_trainer.TorchSpec`,
:class:`~kolo.estimator.lightning_trainer.LightningSpec`,
:class:`~kolo.estimator.keras_trainer.KerasSpec`). The driver builds one from an estimator's
parameters (:func:`spec_fields` fills the shared fields) and ships it to every rank inside the
trainer; the rank opens its share of the data with :meth:`TrainingSpec.open_loaders`.

Example::

    fields = spec_fields(params.get, store, "run_1", meta)
    spec = TorchSpec(**fields, model_bytes=..., ...)
    train_loader, val_loader = spec.open_loaders(hvd.rank(), hvd.size())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from kolo.estimator.checks import check_shapes

__all__ = ["ParamGetter", "TrainingSpec", "checkpoint_bytes", "spec_fields"]

#: ``param(name)``: the value of an estimator parameter (``batch_size``, ``loss``, ...).
ParamGetter = Callable[[str], Any]


@dataclass
class TrainingSpec:
    """The fields every framework's spec has (the framework specs add theirs after these).

    Example::

        spec.columns()            # ["features", "label"]
        spec.open_loaders(0, 2)   # (train loader, validation loader or None)
    """

    store: Any
    run_id: str
    train_path: str
    #: ``None`` when there is no validation data (or it has no rows).
    val_path: Optional[str]
    feature_cols: List[str]
    label_cols: List[str]
    sample_weight_col: Optional[str]
    label_shapes: Optional[List[List[int]]]
    batch_size: int
    val_batch_size: int
    epochs: int
    train_steps_per_epoch: Optional[int]
    validation_steps_per_epoch: Optional[int]
    shuffle: bool
    shuffle_buffer_size: Optional[int]
    random_seed: Optional[int]
    backward_passes_per_step: int
    verbose: int
    train_reader_num_workers: int
    val_reader_num_workers: int
    #: Options of the store's object store (credentials, endpoint) for the loaders.
    storage_options: Dict[str, str]

    def columns(self) -> List[str]:
        """The columns a rank reads, each once: features, labels, the sample weight column."""
        columns = [*self.feature_cols, *self.label_cols]
        if self.sample_weight_col:
            columns.append(self.sample_weight_col)
        return list(dict.fromkeys(columns))

    def open_loaders(self, rank: int, size: int, **options: Any) -> Tuple[Any, Optional[Any]]:
        """This rank's :class:`kolo.data.ParquetLoader` of the training data (shuffled when
        ``shuffle``, whole batches only) and of the validation data (in order, last batch
        kept; ``None`` without validation data). ``options`` go to both (e.g. ``to="numpy"``).

        Example::

            train, val = spec.open_loaders(hvd.rank(), hvd.size(), to="numpy")
        """
        from kolo.data import ParquetLoader

        columns = self.columns()
        common = dict(
            rank=rank,
            size=size,
            seed=0 if self.random_seed is None else int(self.random_seed),
            storage_options=self.storage_options or None,
            **options,
        )
        train = ParquetLoader(
            self.train_path,
            columns,
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            drop_last=True,
            shuffle_buffer_size=self.shuffle_buffer_size,
            num_threads=max(1, self.train_reader_num_workers),
            **common,
        )
        val = None
        if self.val_path:
            val = ParquetLoader(
                self.val_path,
                columns,
                batch_size=self.val_batch_size,
                shuffle=False,
                drop_last=False,
                num_threads=max(1, self.val_reader_num_workers),
                **common,
            )
        return train, val

    def train_steps(self, loader: Any) -> int:
        """Training steps per epoch: ``train_steps_per_epoch``, else one pass of ``loader``."""
        return int(self.train_steps_per_epoch or len(loader))

    def val_steps(self, loader: Any) -> int:
        """Validation steps per epoch: ``validation_steps_per_epoch``, else one pass."""
        return int(self.validation_steps_per_epoch or len(loader))


def checkpoint_bytes(store: Any, run_id: str) -> Optional[bytes]:
    """The bytes of run ``run_id``'s checkpoint in ``store``
    (``store.get_checkpoint_path(run_id)``), or ``None`` when there is none.

    Example::

        data = checkpoint_bytes(store, "run_1")
    """
    path = store.get_checkpoint_path(run_id)
    if path is None or not store.exists(path):
        return None
    return store.read(path)


def spec_fields(param: ParamGetter, store: Any, run_id: str, meta: Any) -> Dict[str, Any]:
    """The :class:`TrainingSpec` fields of an estimator's parameters (``param(name)`` gives
    each, by the Spark estimator's names) for the prepared data ``meta`` (a
    :class:`~kolo.estimator.dataset.PreparedDataset`); checks ``label_shapes``
    (:class:`~kolo.exceptions.InvalidArgumentError`).

    Example::

        spec = KerasSpec(**spec_fields(est._param, store, "run_1", meta), model_bytes=...)
    """
    label_cols = list(param("label_cols"))
    check_shapes(param("label_shapes"), label_cols, "label_shapes", "label")
    options = store.native_location()[1] if hasattr(store, "native_location") else {}
    return dict(
        store=store,
        run_id=run_id,
        train_path=meta.train_path,
        val_path=meta.usable_val_path,
        feature_cols=list(param("feature_cols")),
        label_cols=label_cols,
        sample_weight_col=param("sample_weight_col"),
        label_shapes=param("label_shapes"),
        batch_size=param("batch_size"),
        val_batch_size=param("val_batch_size") or param("batch_size"),
        epochs=param("epochs"),
        train_steps_per_epoch=param("train_steps_per_epoch"),
        validation_steps_per_epoch=param("validation_steps_per_epoch"),
        shuffle=param("shuffle"),
        shuffle_buffer_size=param("shuffle_buffer_size"),
        random_seed=param("random_seed"),
        backward_passes_per_step=param("backward_passes_per_step"),
        verbose=param("verbose"),
        train_reader_num_workers=param("train_reader_num_workers"),
        val_reader_num_workers=param("val_reader_num_workers"),
        storage_options=dict(options),
    )
