"""``KoloEstimator``: the framework-neutral ``fit`` of kolo's Spark estimators (Horovod's
``horovod.spark.common.estimator.HorovodEstimator``, an alias of it here, as is
``HorovodModel`` of :class:`~kolo.spark.common.model.KoloModel`).

:meth:`KoloEstimator.fit` runs the same flow for every framework: check the columns, the
store and the framework's parameters (typed :mod:`kolo.exceptions` errors before anything is
written) → :func:`~kolo.spark.common.util.prepare_data` (Parquet in the store) → launch one
training function per rank with :func:`kolo.spark.run`, showing rank 0's progress (the
estimator core's :func:`~kolo.estimator.training.train_on_ranks`) → build the Spark ML
Transformer from rank 0's result. A framework's estimator is a thin subclass that implements
three hooks:

- :meth:`KoloEstimator._check_params` — framework checks (model set and picklable, parameters
  that do not apply, ...); raise :class:`~kolo.exceptions.InvalidArgumentError`.
- :meth:`KoloEstimator._remote_trainer` — the picklable callable every rank runs (one of the
  estimator core's trainers). It calls ``hvd.init()``, trains on its share of ``meta.train_path``
  (:class:`kolo.data.ParquetLoader` with ``rank``/``size``), checkpoints into the checkpoint file in
  ``store.get_checkpoint_path(run_id)`` (and resumes from it), sends progress with
  :func:`~kolo.estimator.progress.send_progress`, and returns on rank 0 a dict with ``"history"``
  (``{metric: [value per epoch]}``), ``"model"`` (the trained weights in the framework's format),
  optionally ``"start_epoch"`` (first epoch run, when resumed) and ``"timings"``
  (``first_step_unix``, ``train_s``, ``checkpoint_s``, ``returned_unix``); ``None`` on the other
  ranks.
- :meth:`KoloEstimator._make_model` — the Transformer (e.g. a
  :class:`~kolo.spark.torch.TorchModel`) from rank 0's result.

A subclass also sets ``_param_defaults`` (its Params mixin's defaults). Everything else —
``setParams`` with unknown-name checks, persistence (``write``/``read``/``save``/``load``),
``fit_on_parquet``, ``num_proc`` defaulting to Spark's parallelism, the run id, timings — is
shared.

Example (a subclass)::

    class MyEstimator(KoloEstimator, MyParams):
        _param_defaults = staticmethod(my_defaults)

        @abstractmethod
    def _check_params(self):
            if self.getModel() is None:
                raise InvalidArgumentError("model is not set: pass model=...")

        @abstractmethod
    def _remote_trainer(self, store, meta, run_id):
            return MyRemoteTrainer(self._spec(store, meta, run_id))   # picklable

        @abstractmethod
    def _make_model(self, result, run_id, metadata):
            return MyModel(model=rebuild(result["model"]), history=result["history"],
                           run_id=run_id, metadata=metadata, ...)

    model = MyEstimator(num_proc=2, store=store, ...).fit(df)
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional

from pyspark.ml import Estimator, Model

from kolo.estimator.checks import check_store_writable, training_columns
from kolo.estimator.dataset import PreparedDataset, get_dataset_metadata
from kolo.estimator.params import NO_EFFECT, reject_unknown, warn_no_effect
from kolo.estimator.training import train_on_ranks
from kolo.exceptions import InvalidArgumentError, InvalidValueError
from kolo.spark._python_probe import check_executor_python
from kolo.spark._session import spark_target
from kolo.spark.common._df_argument import dataframe_argument
from kolo.spark.common.backend import SparkBackend, default_num_proc
from kolo.spark.common.model import HorovodModel
from kolo.spark.common.serialization import KoloPersistence
from kolo.spark.common.util import prepare_data

__all__ = ["HorovodEstimator", "HorovodModel", "KoloEstimator"]

log = logging.getLogger(__name__)


class KoloEstimator(Estimator, KoloPersistence):
    """The shared ``fit`` flow of the Spark estimators (see the module docstring for the hooks).

    Subclasses mix in a Params class declaring at least the parameters of
    :class:`~kolo.spark.common.params.EstimatorParams` (``num_proc``, ``store``,
    ``feature_cols``, ``label_cols``, ``validation``, ``batch_size``, ``epochs``, ``run_id``,
    ``verbose``, ...), and set ``_param_defaults`` to a function returning their defaults.

    Example::

        est = TorchEstimator(num_proc=2, store=store, model=model, optimizer=opt, loss=loss,
                             feature_cols=["x"], label_cols=["y"])
        model = est.fit(df)           # KoloEstimator._fit
    """

    #: Returns the defaults of the subclass's parameters (set by each subclass).
    _param_defaults: Callable[[], Dict[str, Any]]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._setDefault(**type(self)._param_defaults())
        self.setParams(**kwargs)

    def setParams(self, **kwargs: Any) -> KoloEstimator:
        """Sets several parameters by name (unknown names raise
        :class:`~kolo.exceptions.InvalidArgumentError`).

        Example::

            est.setParams(epochs=3, batch_size=64)
        """
        reject_unknown(type(self).__name__, kwargs, (p.name for p in self.params))
        warn_no_effect(type(self).__name__, kwargs, type(self)._param_defaults())
        self._set(**kwargs)
        return self

    # -- hooks (implemented by each framework) --------------------------------------------------

    def _check_params(self) -> None:
        """Framework checks run before any data is written; raise
        :class:`~kolo.exceptions.InvalidArgumentError` naming the parameter and the fix."""

    def _remote_trainer(self, store: Any, meta: PreparedDataset, run_id: str) -> Callable[[], Any]:
        """The picklable function every rank runs (see the module docstring for its result)."""

    def _make_model(self, result: Dict[str, Any], run_id: str, metadata: Dict[str, Any]) -> Model:
        """The Spark ML Transformer built from rank 0's ``result``; ``metadata`` holds the
        prepared columns (``{"columns": {name: {"dtype", "shape"}}, "train_rows",
        "val_rows", "dataset_idx"}``)."""

    # -- shared checks ---------------------------------------------------------------------------

    def _param(self, name: str) -> Any:
        return self.getOrDefault(getattr(self, name))

    def _check_store(self, store: Any) -> None:
        if store is None:
            raise InvalidArgumentError(
                "store is not set: pass store=kolo.spark.common.store.Store.create(<path>)"
            )
        check_store_writable(store, "this process and the Spark executors")

    def _columns(self) -> List[str]:
        """The columns training reads: features, labels and the sample weight column."""
        return training_columns(
            self.getFeatureCols(), self.getLabelCols(), self.getSampleWeightCol()
        )

    def _backend(self) -> Any:
        """The ``backend`` given (Horovod's: then ``num_proc`` must not be), or None."""
        backend = self.getOrDefault(self.backend)
        if backend is not None and self.getNumProc() is not None:
            raise InvalidValueError(
                'At most one of parameters "backend" and "num_proc" may be specified: the '
                "backend says how many ranks (SparkBackend(num_proc=...))"
            )
        return backend

    def _num_proc(self) -> int:
        backend = self._backend()
        if backend is not None:
            return int(backend.num_processes())
        num_proc = self.getNumProc()
        if num_proc is None:
            # Spark's default parallelism, on a classic session or through Spark Connect
            num_proc = default_num_proc()
        if int(num_proc) < 1:
            raise InvalidArgumentError(f"num_proc={num_proc} must be at least 1")
        return int(num_proc)

    def _check_all(self) -> None:
        # parameters set through their setters warn here (once per process)
        values = {p.name: self._param(p.name) for p in self.params if p.name in NO_EFFECT}
        warn_no_effect(type(self).__name__, values, type(self)._param_defaults())
        self._columns()  # raises when feature_cols or label_cols is not set
        self._check_store(self.getStore())
        self._check_params()

    # -- fitting ---------------------------------------------------------------------------------

    def fit(self, df: Any = None, params: Any = None, *, dataset: Any = None) -> Any:
        """Trains on the DataFrame ``df`` and returns the trained model (Horovod's
        ``fit(df, params=None)``; PySpark's keyword ``dataset=`` works too). ``params``
        overrides embedded parameters, as in Spark ML (a list of maps gives a list of models).

        Example::

            model = est.fit(df)
            model = est.fit(df=train_df, params={est.epochs: 3})
        """
        return super().fit(dataframe_argument(df, dataset, "fit"), params)

    def _fit(self, df: Any) -> Model:
        started = time.monotonic()
        # Fail on bad or unpicklable parameters before Spark writes anything.
        self._check_all()
        num_proc = self._num_proc()
        if self._backend() is None or isinstance(self._backend(), SparkBackend):
            # An executor Python without kolo fails here, before the data is written (on a
            # classic session or through Spark Connect: the probe runs on df's session).
            check_executor_python(spark_target(df.sparkSession), num_proc)
        with prepare_data(
            num_proc,
            self.getStore(),
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

    def fit_on_parquet(
        self, params: Optional[Dict[Any, Any]] = None, dataset_idx: Optional[int] = None
    ) -> Model:
        """Trains on data already prepared in the store (``intermediate_train_data.<idx>``,
        by an earlier ``fit``, :func:`kolo.spark.common.util.prepare_data` or
        :func:`kolo.data.prepare_data`); ``dataset_idx`` defaults to 0.

        Example::

            with prepare_data(2, store, df, ["label"], ["features"]) as idx:
                model = est.fit_on_parquet(dataset_idx=idx)
        """
        est = self.copy(params) if params else self
        est._check_all()
        return est._fit_on_prepared_data(0 if dataset_idx is None else dataset_idx, est._num_proc())

    def _fit_on_prepared_data(self, dataset_idx: int, num_proc: int) -> Model:
        store = self.getStore()
        meta = get_dataset_metadata(store, dataset_idx, self._columns())

        reports: list[Any] = []

        def launch(trainer: Callable[[], Any], on_message: Callable[[int, Any], None]) -> Any:
            from kolo.spark import run

            backend = self._backend()
            if isinstance(backend, SparkBackend):
                return backend.run(
                    trainer, env={}, _on_message=on_message, _on_launch_report=reports.append
                )
            if backend is not None:  # a user's Backend: Horovod's call
                return backend.run(trainer, args=(), kwargs={}, env={})
            return run(
                trainer,
                num_proc=num_proc,
                verbose=self.getVerbose(),
                _on_message=on_message,
                _on_launch_report=reports.append,
            )

        run = train_on_ranks(
            meta,
            lambda run_id: self._remote_trainer(store, meta, run_id),
            launch,
            ranks=num_proc,
            ranks_param="num_proc",
            batch_size=self.getBatchSize(),
            run_id=self.getRunId(),
            verbose=self.getVerbose(),
            epochs=self.getEpochs(),
        )
        result, launched = run.result, run.launched_unix
        model = self._make_model(result, run.run_id, meta.metadata())
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
        if reports:
            model._timings["launch_phases"] = _launch_phases(reports[0], rank0, first_step)
        model._start_epoch = result.get("start_epoch", 0)
        return model


def _launch_phases(report: Any, rank0: Dict[str, Any], first_step: float) -> Dict[str, float]:
    """Where a fit's ``launch`` went: ``kolo.spark.run``'s phases up to every rank's trainer
    starting, then rank 0's set-up steps (``trainer_`` + imports, init, build, loaders, resume,
    tensorboard, when the trainer reports them) and ``trainer_first_step`` (the rest until
    its first step); times never go back, so the phases add up to the report's call to the
    first step."""
    phases = dict(report.phases())
    points = report.milestones()
    last = points[-1][1] if points else first_step
    for step, at in (rank0.get("setup_unix") or {}).items():
        if isinstance(at, (int, float)):
            phases[f"trainer_{step}"] = max(0.0, float(at) - last)
            last = max(last, float(at))
    phases["trainer_first_step"] = max(0.0, first_step - last)
    return phases


#: Horovod's name of the estimators' base class
#: (``horovod.spark.common.estimator.HorovodEstimator``): ``isinstance(est, HorovodEstimator)``
#: holds for every kolo Spark estimator.
HorovodEstimator = KoloEstimator
