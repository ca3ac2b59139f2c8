"""``TorchEstimator``: a Spark ML Estimator that trains a PyTorch model with kolo on Spark
executors and returns a :class:`~kolo.spark.torch.TorchModel` (Horovod's
``horovod.spark.torch.TorchEstimator``).

Example::

    import torch
    from kolo.spark.common.store import Store
    from kolo.spark.torch import TorchEstimator

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    est = TorchEstimator(
        num_proc=2,
        store=Store.create("/tmp/kolo-store"),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        loss=torch.nn.functional.cross_entropy,
        feature_cols=["features"],
        label_cols=["label"],
        validation=0.1,
        batch_size=32,
        epochs=10,
    )
    torch_model = est.fit(train_df)
    predictions = torch_model.transform(test_df)   # adds label__output
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional

from pyspark.ml import Estimator
from pyspark.ml.util import MLReadable, MLWritable

from kolo.exceptions import InvalidArgumentError
from kolo.spark.common.params import TorchEstimatorParams, torch_estimator_defaults
from kolo.spark.common.serialization import KoloReader, KoloWriter
from kolo.spark.common.training_params import reject_unknown
from kolo.spark.common.util import PreparedDataset, get_dataset_metadata, prepare_data
from kolo.spark.torch.model import TorchModel
from kolo.spark.torch.remote import (
    Progress,
    RemoteLossConstructor,
    RemoteTrainer,
    TrainingSpec,
    build_training_spec,
    check_model_and_loss,
    check_rows_per_rank,
    check_store_writable,
    losses_from,
    trained_model,
)

__all__ = ["RemoteLossConstructor", "TorchEstimator"]

log = logging.getLogger(__name__)


class TorchEstimator(Estimator, TorchEstimatorParams, MLReadable, MLWritable):
    """Trains a PyTorch model on a Spark DataFrame with kolo (Horovod's parameters).

    Keyword arguments are the parameters (each also has ``getX``/``setX``):

    - ``num_proc``: ranks (default: Spark's default parallelism); ``store``: a
      :class:`kolo.store.Store` for the prepared data, checkpoints and logs.
    - ``model`` (a ``torch.nn.Module``), ``optimizer`` (built on ``model.parameters()``; each
      rank builds the same class with the same param-group hyper-parameters on its copy, the
      learning rate multiplied by the number of ranks, as Horovod does), ``loss`` (a callable
      ``loss(output, label)`` or one per label column; with ``sample_weight_col`` it is called
      with ``reduction="none"``, or a ``torch.nn`` loss module is used unreduced),
      ``loss_weights``, ``loss_constructors`` (functions returning losses, for losses that
      cannot be pickled), ``metrics`` (``metric(output, label) -> number``, averaged over
      ranks), ``callbacks`` (objects with any of ``on_epoch_begin(epoch, logs)``,
      ``on_train_batch_end(step, logs)``, ``on_epoch_end(epoch, logs)``).
    - ``feature_cols``, ``label_cols``, ``sample_weight_col``, ``validation`` (ratio or column),
      ``input_shapes``/``label_shapes`` (reshape, batch dimension included, e.g.
      ``[[-1, 1, 8, 8]]``), ``transformation_fn`` (``fn(batch dict) -> batch dict``).
    - ``batch_size`` (32), ``val_batch_size``, ``epochs`` (1), ``train_steps_per_epoch``,
      ``validation_steps_per_epoch``, ``shuffle`` (True), ``random_seed``,
      ``partitions_per_process`` (10), ``backward_passes_per_step`` (1),
      ``gradient_compression``, ``train_minibatch_fn``, ``use_gpu`` (True), ``verbose`` (1),
      ``run_id`` (an existing checkpoint of this id resumes training).
    - Accepted for Horovod compatibility, with no effect: ``backend``, ``reader_pool_type``,
      ``inmemory_cache_all``, ``compress_sparse_cols``, ``mp_start_method``.

    Floating-point features and labels are given to the model as float32 (Horovod casts to
    float too); integer labels stay integers (for ``cross_entropy``), and a floating-point
    label with one dimension fewer than its output of several values per row (class indices
    from ``StringIndexer``) is given to losses and metrics as int64.

    Example::

        est = TorchEstimator(num_proc=2, store=store, model=model, optimizer=opt,
                             loss=torch.nn.functional.mse_loss, feature_cols=["x"],
                             label_cols=["y"], label_shapes=[[-1, 1]], epochs=5)
        model = est.fit(df)
        model.getHistory()["train_loss"]
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._setDefault(**torch_estimator_defaults())
        self.setParams(**kwargs)

    def setParams(self, **kwargs: Any) -> TorchEstimator:
        """Sets several parameters by name.

        Example::

            est.setParams(epochs=3, batch_size=64)
        """
        reject_unknown("TorchEstimator", kwargs, (p.name for p in self.params))
        self._set(**kwargs)
        return self

    # -- persistence ---------------------------------------------------------------------------

    def write(self) -> KoloWriter:
        """A writer that saves every parameter (``write().overwrite().save(path)``)."""
        return KoloWriter(self)

    @classmethod
    def read(cls) -> KoloReader:
        """A reader of what :meth:`write` saved."""
        return KoloReader(cls)

    # -- checks ----------------------------------------------------------------------------------

    def _param(self, name: str) -> Any:
        return self.getOrDefault(getattr(self, name))

    def _losses(self) -> List[Any]:
        return losses_from(self._param)

    def _check_store(self, store: Any) -> None:
        if store is None:
            raise InvalidArgumentError(
                "store is not set: pass store=kolo.spark.common.store.Store.create(<path>)"
            )
        check_store_writable(store, "this process and the Spark executors")

    def _spec(self, store: Any, meta: PreparedDataset, run_id: str) -> TrainingSpec:
        val_path = meta.val_path if meta.val_rows > 0 else None
        return build_training_spec(self._param, store, run_id, meta.train_path, val_path)

    def _columns(self) -> List[str]:
        columns = [*self.getFeatureCols(), *self.getLabelCols()]
        if self.getSampleWeightCol():
            columns.append(self.getSampleWeightCol())
        return list(dict.fromkeys(columns))

    def _check_columns_set(self) -> None:
        if not self.getFeatureCols():
            raise InvalidArgumentError("feature_cols is not set: pass feature_cols=[...]")
        if not self.getLabelCols():
            raise InvalidArgumentError("label_cols is not set: pass label_cols=[...]")

    # -- fitting ---------------------------------------------------------------------------------

    def _num_proc(self) -> int:
        num_proc = self.getNumProc()
        if num_proc is None:
            from pyspark import SparkContext

            num_proc = SparkContext.getOrCreate().defaultParallelism
        if int(num_proc) < 1:
            raise InvalidArgumentError(f"num_proc={num_proc} must be at least 1")
        return int(num_proc)

    def _fit(self, df: Any) -> TorchModel:
        started = time.monotonic()
        self._check_columns_set()
        store = self.getStore()
        self._check_store(store)
        # Fail on unpicklable objects before Spark writes anything.
        self._spec_checks_only()
        num_proc = self._num_proc()
        with prepare_data(
            num_proc,
            store,
            df,
            label_columns=self.getLabelCols(),
            feature_columns=self.getFeatureCols(),
            validation=self.getValidation(),
            sample_weight_col=self.getSampleWeightCol(),
            compress_sparse=self.getCompressSparseCols(),
            partitions_per_process=self.getPartitionsPerProcess(),
            verbose=self.getVerbose(),
            random_seed=self.getRandomSeed(),
        ) as dataset_idx:
            prepared_s = time.monotonic() - started
            model = self._fit_on_prepared_data(dataset_idx, num_proc)
        model._timings["parts"]["prepare"] = prepared_s
        return model

    def _spec_checks_only(self) -> None:
        check_model_and_loss(self._param)

    def fit_on_parquet(
        self, params: Optional[Dict[Any, Any]] = None, dataset_idx: Optional[int] = None
    ) -> TorchModel:
        """Trains on data already prepared in the store (``intermediate_train_data.<idx>``,
        by an earlier ``fit``, :func:`kolo.spark.common.util.prepare_data` or
        :func:`kolo.data.prepare_data`); ``dataset_idx`` defaults to 0.

        Example::

            with prepare_data(2, store, df, ["label"], ["features"]) as idx:
                model = est.fit_on_parquet(dataset_idx=idx)
        """
        est = self.copy(params) if params else self
        est._check_columns_set()
        est._check_store(est.getStore())
        est._spec_checks_only()
        return est._fit_on_prepared_data(0 if dataset_idx is None else dataset_idx, est._num_proc())

    def _fit_on_prepared_data(self, dataset_idx: int, num_proc: int) -> TorchModel:
        store = self.getStore()
        meta = get_dataset_metadata(store, dataset_idx, self._columns())
        check_rows_per_rank(meta.train_rows, num_proc, self.getBatchSize(), "num_proc")
        run_id = self.getRunId() or f"run_{int(time.time() * 1000)}"
        spec = self._spec(store, meta, run_id)
        progress = Progress(self.getVerbose(), self.getEpochs())
        from kolo.spark import run

        launched = time.time()
        try:
            results = run(
                RemoteTrainer(spec),
                num_proc=num_proc,
                verbose=self.getVerbose(),
                _on_message=progress.on_message,
            )
        finally:
            progress.close()
        result = results[0]
        trained = trained_model(self.getModel(), result["model"])
        metadata = {
            "columns": {
                name: {"dtype": info.dtype, "shape": info.shape}
                for name, info in meta.columns.items()
            },
            "train_rows": meta.train_rows,
            "val_rows": meta.val_rows,
            "dataset_idx": dataset_idx,
        }
        model = TorchModel(
            model=trained,
            history=result["history"],
            feature_columns=self.getFeatureCols(),
            label_columns=self.getLabelCols(),
            run_id=run_id,
            metadata=metadata,
            input_shapes=self.getInputShapes(),
            use_gpu=self.getUseGpu(),
        )
        rank0 = result.get("timings", {})
        first_step = rank0.get("first_step_unix") or rank0.get("returned_unix", launched)
        model._timings = {
            "first_step": first_step,
            "parts": {
                "prepare": 0.0,
                "launch": first_step - launched,
                "train": rank0.get("train_s", 0.0),
                "checkpoint": rank0.get("checkpoint_s", 0.0),
                "model_return": time.time() - rank0.get("returned_unix", launched),
            },
        }
        model._start_epoch = result.get("start_epoch", 0)
        return model
