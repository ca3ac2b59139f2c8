"""``kolo.ray.TorchEstimator``: trains a PyTorch model with kolo on Ray actors, from a
``ray.data.Dataset``, Parquet in a store, or any source :func:`kolo.data.prepare_data` takes.

The parameters, checks, training loop and driver flow are the estimator core's
(:mod:`kolo.estimator`: :class:`~kolo.estimator.TorchTrainer`, built by
:func:`~kolo.estimator.build_torch_spec`, run by :func:`~kolo.estimator.train_on_ranks`), as
for the Spark estimator; this module adds what Ray supplies: ranks started once each by
:meth:`kolo.ray.RayExecutor.run`, rank 0's progress messages taken from the executor's job
driver, and Ray Datasets as a source. The GPU a rank trains on is its ``local_rank`` of the
node's ``CUDA_VISIBLE_DEVICES``, which the executor orders that way.

Example::

    import numpy as np
    import ray
    import torch
    from kolo.ray import TorchEstimator
    from kolo.store import Store

    ray.init(num_cpus=2, include_dashboard=False)
    ds = ray.data.from_items([{"x": np.random.rand(8).astype("float32"), "y": i % 2}
                              for i in range(1000)])
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    est = TorchEstimator(
        num_workers=2,
        store=Store.create("/tmp/kolo-store"),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        loss=torch.nn.functional.cross_entropy,
        feature_cols=["x"],
        label_cols=["y"],
        validation=0.1,
        epochs=3,
    )
    result = est.fit(ds)
    result.model, result.history["train_loss"], result.checkpoint_path
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Union

from kolo.estimator.checks import check_store_writable, training_columns
from kolo.estimator.params import reject_unknown, training_defaults, warn_no_effect
from kolo.estimator.spec import checkpoint_file
from kolo.estimator.torch_spec import build_torch_spec, check_model_and_loss, trained_model
from kolo.estimator.torch_trainer import TorchTrainer
from kolo.estimator.training import train_on_ranks
from kolo.exceptions import DataError, InvalidArgumentError

__all__ = ["TorchEstimator", "TrainingResult"]

log = logging.getLogger(__name__)

#: The estimator's parameters and defaults: Ray placement, then the Spark estimator's training
#: parameters with its defaults (``use_gpu`` differs: on Ray it reserves GPUs for the actors,
#: so it is off unless asked for).
_DEFAULTS: Dict[str, Any] = {
    "num_workers": None,
    "cpus_per_worker": 1,
    "use_gpu": False,
    "gpus_per_worker": None,
    "settings": None,
    "executor": None,
    **training_defaults(),
}


@dataclasses.dataclass
class TrainingResult:
    """What :meth:`TorchEstimator.fit` returns.

    Example::

        result = est.fit(ds)
        result.model.eval()
        print(result.history["val_loss"][-1], result.checkpoint_path)
    """

    #: The trained ``torch.nn.Module`` (a copy of the estimator's model with rank 0's weights,
    #: on the CPU).
    model: Any
    #: Per-epoch metrics averaged over the ranks: ``train_loss``, ``train_<metric>``... and
    #: the ``val_`` ones with validation.
    history: Dict[str, List[float]]
    run_id: str
    #: Where rank 0 wrote the run's checkpoint file (in ``store.get_checkpoint_path(run_id)``,
    #: named ``store.get_checkpoint_filename()``; load it
    #: with :func:`kolo.estimator.torch_trainer.load_checkpoint`); ``None`` for a store without
    #: one.
    checkpoint_path: Optional[str]
    #: Where the run's TensorBoard logs are (``store.get_logs_path(run_id)``).
    logs_path: Optional[str]
    #: The prepared data trained on: ``dataset_idx`` (-1 for a plain Parquet path),
    #: ``train_path``, ``val_path``, ``train_rows``, ``val_rows``, ``columns`` (dtype, shape).
    metadata: Dict[str, Any]
    #: Seconds: ``prepare`` (writing the data), ``start`` (the executor), ``train`` (rank 0's
    #: epochs), ``total``; ``start_epoch`` > 0 when the run resumed from its checkpoint.
    timings: Dict[str, float]
    start_epoch: int = 0


def _arrow_batches(dataset: Any, columns: List[str]) -> Any:
    """The selected columns of a Ray Dataset as a ``pyarrow.RecordBatchReader``, Ray's tensor
    columns (one array per row) as fixed-size lists of their flattened values."""
    import numpy as np
    import pyarrow as pa

    def convert(table: Any) -> Any:
        arrays, fields = [], []
        for name in columns:
            column = table.column(name).combine_chunks()
            kind = column.type
            if isinstance(kind, pa.ExtensionType):
                shape = tuple(getattr(kind, "shape", ()) or ())
                storage = column.storage
                if shape and all(isinstance(d, int) and d >= 0 for d in shape):
                    values = storage.flatten()
                    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
                        values = values.flatten()
                    column = pa.FixedSizeListArray.from_arrays(values, int(np.prod(shape)))
                else:
                    raise DataError(
                        f"column {name!r} holds tensors of variable shape ({kind}); give "
                        "every row an array of the same shape"
                    )
            arrays.append(column)
            fields.append(pa.field(name, column.type))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))

    batches = (
        convert(table)
        for table in dataset.select_columns(columns).iter_batches(
            batch_format="pyarrow", batch_size=None
        )
        if table.num_rows
    )
    first = next(batches, None)
    if first is None:
        raise DataError("the Ray Dataset has no rows: check its source and filters before fitting")

    def chain() -> Any:
        yield first
        yield from batches

    return pa.RecordBatchReader.from_batches(first.schema, chain())


class TorchEstimator:
    """Trains a PyTorch model on Ray with kolo; the Spark estimator's parameters (see
    ``docs/estimator.md``), plus Ray placement.

    Placement: ``num_workers`` ranks (default 1 per CPU the cluster has, at most the number
    of training files), each an actor with ``cpus_per_worker`` CPUs (and ``gpus_per_worker``
    GPUs with ``use_gpu``; the model trains on the rank's GPU), started by a
    :class:`kolo.ray.RayExecutor` made from ``settings``
    (:meth:`RayExecutor.create_settings`) — or pass ``executor``, an existing
    ``RayExecutor`` (started or not; one the estimator started is shut down after ``fit``).

    Model and loop: ``model``, ``optimizer`` (each rank builds the same class with the same
    param groups, lr multiplied by the number of ranks as Horovod does), ``loss`` (or one per
    label column, or ``loss_constructors``), ``loss_weights``, ``metrics``, ``callbacks``,
    ``feature_cols``, ``label_cols``, ``sample_weight_col``, ``validation`` (ratio or column),
    ``input_shapes``/``label_shapes``, ``transformation_fn``, ``train_minibatch_fn``,
    ``batch_size`` (32), ``val_batch_size``, ``epochs`` (1), ``train_steps_per_epoch``,
    ``validation_steps_per_epoch``, ``shuffle`` (True), ``shuffle_buffer_size``,
    ``random_seed``, ``backward_passes_per_step`` (1), ``gradient_compression``,
    ``partitions_per_process`` (10 files per rank), ``run_id`` (an existing checkpoint of
    that id resumes), ``store`` (a :class:`kolo.store.Store` or a prefix: prepared data,
    checkpoints, logs), ``verbose`` (1: a progress bar per epoch on the driver), and Horovod's
    loader settings (``train_reader_num_workers``, ``reader_pool_type``,
    ``inmemory_cache_all``, ``data_module``, ``debug_data_loader``... as in
    ``docs/estimator.md``).

    Unknown parameters raise :class:`~kolo.exceptions.InvalidArgumentError`.

    Example::

        est = TorchEstimator(num_workers=2, store="/tmp/kolo-store", model=model,
                             optimizer=opt, loss=torch.nn.functional.cross_entropy,
                             feature_cols=["features"], label_cols=["label"], epochs=5)
        result = est.fit(ray_dataset)          # or est.fit(pandas_df), est.fit_on_parquet(0)
        result.history["train_loss"]
    """

    def __init__(self, **params: Any) -> None:
        self._params: Dict[str, Any] = dict(_DEFAULTS)
        self.set_params(**params)

    # -- parameters ------------------------------------------------------------------------

    def set_params(self, **params: Any) -> TorchEstimator:
        """Sets parameters by name; returns ``self``.

        Example::

            est.set_params(epochs=3, batch_size=64)
        """
        reject_unknown("TorchEstimator", params, _DEFAULTS)
        warn_no_effect("TorchEstimator", params, _DEFAULTS)
        self._params.update(params)
        return self

    def get_params(self) -> Dict[str, Any]:
        """Every parameter's value (a copy of the mapping; the objects are shared).

        Example::

            assert est.get_params()["batch_size"] == 32
        """
        return dict(self._params)

    def _param(self, name: str) -> Any:
        return self._params[name]

    # -- checks ----------------------------------------------------------------------------

    def _store(self) -> Any:
        from kolo.store import Store

        store = self._params["store"]
        if store is None:
            raise InvalidArgumentError(
                "store is not set: pass store=kolo.store.Store.create(<path or URL>) (or the "
                "path itself); it holds the prepared data, checkpoints and logs"
            )
        if isinstance(store, str):
            store = Store.create(store)
            self._params["store"] = store
        check_store_writable(store, "the driver and every Ray node")
        return store

    def _columns(self) -> List[str]:
        params = self._params
        columns = training_columns(
            params["feature_cols"], params["label_cols"], params["sample_weight_col"]
        )
        for name in ("feature_cols", "label_cols"):
            if isinstance(params[name], str):
                params[name] = [params[name]]
        return columns

    def _num_workers(self) -> int:
        executor = self._params["executor"]
        if executor is not None:
            return int(executor.num_workers)
        num = self._params["num_workers"]
        if num is None:
            import ray

            if not ray.is_initialized():
                ray.init()
            num = max(1, int(ray.cluster_resources().get("CPU", 1) // self._cpus()))
        if isinstance(num, bool) or not isinstance(num, int) or num < 1:
            raise InvalidArgumentError(f"num_workers={num!r} must be an int of at least 1")
        return num

    def _cpus(self) -> float:
        return float(self._params["cpus_per_worker"] or 1)

    # -- fitting ---------------------------------------------------------------------------

    def fit(self, data: Any) -> TrainingResult:
        """Prepares ``data`` into the store as Parquet and trains on it.

        ``data``: a ``ray.data.Dataset`` (its feature/label/weight columns streamed to the
        driver as Arrow batches and written by :func:`kolo.data.prepare_data`, dictionary
        encoding off, ``num_workers * partitions_per_process`` files; Ray tensor columns
        become fixed-length arrays), or anything :func:`kolo.data.prepare_data` takes (a
        pandas DataFrame, a pyarrow Table, Parquet/CSV paths). Columns: numbers, bools, or
        fixed-length arrays of them.

        Raises :class:`~kolo.exceptions.DataError` (a missing or unusable column — the
        message lists the available ones —, no rows), :class:`~kolo.exceptions.
        InvalidArgumentError` (missing or inconsistent parameters, unpicklable objects),
        :class:`~kolo.exceptions.StoreError`, and
        :class:`~kolo.exceptions.RankFailedError` when a rank fails.

        Example::

            result = est.fit(ray.data.from_pandas(df))
        """
        started = time.monotonic()
        columns = self._columns()
        store = self._store()
        check_model_and_loss(self._param)
        num_workers = self._num_workers()
        source = data
        if _is_ray_dataset(data):
            names = list(data.schema().names)
            for role, wanted in (
                ("feature", self._params["feature_cols"]),
                ("label", self._params["label_cols"]),
                ("sample weight", [self._params["sample_weight_col"]]),
                ("validation", [self._params["validation"]]),
            ):
                for name in wanted:
                    if isinstance(name, str) and name not in names:
                        raise DataError(
                            f"the {role} column {name!r} is not in the Ray Dataset; its "
                            f"columns are: {', '.join(names)} (check the name's spelling "
                            "and case)"
                        )
            selected = list(columns)
            if isinstance(self._params["validation"], str):
                selected.append(self._params["validation"])
            source = _arrow_batches(data, list(dict.fromkeys(selected)))
        from kolo.data import prepare_data

        seed = self._params["random_seed"]
        prepared = prepare_data(
            store,
            source,
            feature_columns=self._params["feature_cols"],
            label_columns=self._params["label_cols"],
            validation=self._params["validation"] or None,
            sample_weight_col=self._params["sample_weight_col"],
            num_processes=num_workers,
            partitions_per_process=int(self._params["partitions_per_process"]),
            seed=0 if seed is None else int(seed),
        )
        prepare_s = time.monotonic() - started
        result = self.fit_on_parquet(prepared.dataset_idx)
        result.timings["prepare"] = prepare_s
        result.timings["total"] = time.monotonic() - started
        return result

    def fit_on_parquet(
        self, data: Union[int, str, None] = None, val_path: Optional[str] = None
    ) -> TrainingResult:
        """Trains on Parquet data already written: ``data`` an int is the index of a dataset
        prepared in the store (``intermediate_train_data.<idx>``, by :meth:`fit`,
        :func:`kolo.data.prepare_data` or the Spark estimator; default 0), a string a path or
        URL of Parquet files to train on as they are (``val_path``: optional validation
        files). Files without dictionary encoding load fastest.

        Example::

            prepared = kolo.data.prepare_data(store, "train.parquet", feature_columns=["x"],
                                              label_columns=["y"], num_processes=2)
            result = est.fit_on_parquet(prepared.dataset_idx)
            result = est.fit_on_parquet("s3://bucket/train/")
        """
        from kolo.estimator.dataset import describe_dataset, get_dataset_metadata

        started = time.monotonic()
        columns = self._columns()
        store = self._store()
        check_model_and_loss(self._param)
        if data is None or (isinstance(data, int) and not isinstance(data, bool)):
            meta = get_dataset_metadata(store, 0 if data is None else data, columns)
        elif isinstance(data, str):
            options = store.native_location()[1] if hasattr(store, "native_location") else None
            meta = describe_dataset(data, val_path, options, columns)
        else:
            raise InvalidArgumentError(
                f"fit_on_parquet takes a dataset index (int) or a Parquet path (str), not "
                f"{type(data).__name__}; for a Ray Dataset or a DataFrame use fit()"
            )
        result = self._train(store, meta)
        result.timings["total"] = time.monotonic() - started
        return result

    def _train(self, store: Any, meta: Any) -> TrainingResult:
        params = self._params
        num_workers = self._num_workers()
        timings: Dict[str, float] = {"prepare": 0.0}

        def launch(trainer: TorchTrainer, on_message: Callable[[int, Any], None]) -> List[Any]:
            executor, owned = self._executor(num_workers)
            began = time.monotonic()
            try:
                if owned:
                    executor.start()
                timings["start"] = time.monotonic() - began
                return _run_with_progress(executor, trainer, on_message)
            finally:
                if owned:
                    executor.shutdown()

        run = train_on_ranks(
            meta,
            lambda run_id: TorchTrainer(build_torch_spec(self._param, store, run_id, meta)),
            launch,
            ranks=num_workers,
            ranks_param="num_workers",
            batch_size=int(params["batch_size"]),
            run_id=params["run_id"],
            verbose=int(params["verbose"]),
            epochs=int(params["epochs"]),
        )
        rank0 = run.result
        timings["train"] = float(rank0.get("timings", {}).get("train_s", 0.0))
        return TrainingResult(
            model=trained_model(params["model"], rank0["model"]),
            history=rank0["history"],
            run_id=run.run_id,
            checkpoint_path=checkpoint_file(store, run.run_id),
            logs_path=store.get_logs_path(run.run_id),
            metadata={
                **meta.metadata(),
                "train_path": meta.train_path,
                "val_path": meta.usable_val_path,
            },
            timings=timings,
            start_epoch=int(rank0.get("start_epoch", 0)),
        )

    def _executor(self, num_workers: int) -> tuple:
        """``(executor, owned)``: the given executor (owned if not started yet), or a new one."""
        from kolo.ray.executor import RayExecutor

        executor = self._params["executor"]
        if executor is not None:
            return executor, not executor.workers
        executor = RayExecutor(
            self._params["settings"],
            num_workers=num_workers,
            cpus_per_worker=self._cpus(),
            use_gpu=bool(self._params["use_gpu"]),
            gpus_per_worker=self._params["gpus_per_worker"],
        )
        return executor, True


def _is_ray_dataset(data: Any) -> bool:
    module = type(data).__module__ or ""
    return module.startswith("ray.data") and hasattr(data, "iter_batches")


def _run_with_progress(
    executor: Any, trainer: TorchTrainer, on_message: Callable[[int, Any], None]
) -> List[Any]:
    """``executor.run(trainer)`` (fail-fast), with rank 0's progress messages taken from the
    job driver on a thread and handed to ``on_message(rank, message)``."""
    import cloudpickle

    driver = executor._driver
    done = threading.Event()

    def pump() -> None:
        while True:
            last = done.is_set()  # after the run: one more poll for the last epoch's message
            try:
                events = driver.poll(0.05 if last else 0.2)
            except Exception as err:  # the job ended under us
                log.debug("progress poll stopped: %s", err)
                return
            for event in events:
                if event[0] == "message":
                    _, task, rank, data = event
                    try:
                        on_message(task if rank is None else rank, cloudpickle.loads(data))
                    except Exception as err:  # a bar that fails must not stop training
                        log.debug("progress message not shown: %s", err)
            if last:
                return

    thread = threading.Thread(target=pump, name="kolo-ray-progress", daemon=True)
    thread.start()
    try:
        return executor.run(trainer)
    finally:
        done.set()
        thread.join(timeout=5)
