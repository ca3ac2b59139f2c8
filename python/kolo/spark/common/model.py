"""``KoloModel``: the base of the Spark ML Transformers kolo's estimators return
(:class:`~kolo.spark.torch.TorchModel`, :class:`~kolo.spark.keras.KerasModel`; Horovod's
``HorovodModel``, an alias of :class:`KoloModel`).

It holds what every trained model shares: the parameters and their checks, the fit's timings,
the output columns, persistence (``write``/``read``/``save``/``load`` through
:mod:`kolo.spark.common.serialization`) and ``transform``, which adds one output column per
label through :func:`~kolo.spark.common._inference.predict_columns`. A framework's model mixes
in its Params class and implements three hooks:

- ``_predictor`` — its :class:`~kolo.spark.common._inference.Predictor` subclass;
- :meth:`KoloModel._payload` — what the predictor loads on the workers (bytes);
- :meth:`KoloModel._sample_outputs` — the model's outputs on two rows of zeros shaped like the
  training data (from which the output columns' sizes are read).

Example::

    model = est.fit(df)                       # a TorchModel, a KoloModel
    model.getOutputCols()                     # ["label__output"]
    model.transform(test_df)                  # + label__output
    model.write().overwrite().save("/tmp/digits_model")
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Callable, Dict, List, Optional

from pyspark.ml import Model

from kolo.estimator.params import reject_unknown
from kolo.exceptions import InvalidArgumentError
from kolo.spark.common._df_argument import dataframe_argument
from kolo.spark.common._inference import predict_columns
from kolo.spark.common.serialization import KoloPersistence

__all__ = ["HorovodModel", "KoloModel"]


class KoloModel(Model, KoloPersistence):
    """The shared part of kolo's trained models (see the module docstring for the hooks).

    Subclasses mix in a Params class declaring at least the parameters of
    :class:`~kolo.spark.common.params.ModelParams` and set ``_param_defaults`` to a function
    returning their defaults.

    Example::

        model = TorchModel(model=net, feature_columns=["x"], label_columns=["y"])
        model.getOutputCols()       # ["y__output"]
    """

    #: Returns the defaults of the subclass's parameters (set by each subclass).
    _param_defaults: Callable[[], Dict[str, Any]]
    #: The :class:`~kolo.spark.common._inference.Predictor` subclass that runs the model.
    _predictor: type

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._setDefault(**type(self)._param_defaults())
        self.setParams(**kwargs)
        self._timings: Dict[str, Any] = {}
        self._start_epoch = 0

    def setParams(self, **kwargs: Any) -> KoloModel:
        """Sets several parameters by name, as the constructor takes them (Horovod's
        ``_metadata`` is ``metadata``; unknown names raise
        :class:`~kolo.exceptions.InvalidArgumentError`).

        Example::

            model.setParams(output_cols=["pred"], inference_batch_size=256)
        """
        if "_metadata" in kwargs:
            kwargs["metadata"] = kwargs.pop("_metadata")
        reject_unknown(type(self).__name__, kwargs, (p.name for p in self.params))
        self._set(**kwargs)
        return self

    def getTimings(self) -> Dict[str, Any]:
        """Where the time of the ``fit`` that made this model went (empty for a loaded model):
        ``first_step`` (unix time the first training step started on rank 0) and ``parts``,
        seconds of ``prepare`` (data preparation; 0 when reused or ``fit_on_parquet``),
        ``launch`` (``kolo.spark.run`` call to the first step: barrier stage, rank start,
        ``hvd.init``, model and loader set-up, broadcasts), ``train`` (epochs, validation
        included, on rank 0), ``checkpoint`` (rank 0's writes) and ``model_return`` (rank 0's
        return to the trained model on the driver: TensorBoard sync, result transfer, ranks'
        exit, loading the weights); with ``kolo.spark.run`` as the launcher (no backend or a
        ``SparkBackend``), ``launch_phases``: where ``launch`` went, phase name to seconds:
        ``kolo.spark.run``'s phases until every rank's trainer started (see ``docs/spark.md``),
        then rank 0's ``trainer_imports``, ``trainer_init`` (``hvd.init``), ``trainer_build``
        (model, optimizer, broadcasts), ``trainer_loaders``, ``trainer_resume``,
        ``trainer_tensorboard`` and ``trainer_first_step``.

        Example::

            parts = model.getTimings()["parts"]
            print(f"launch {parts['launch']:.2f} s, train {parts['train']:.2f} s")
        """
        return dict(self._timings)

    def getOutputCols(self) -> List[str]:
        """The output column names: those set, else ``<label>__output`` for each label.

        Example::

            model.getOutputCols()     # ["label__output"]
        """
        cols = self.getOrDefault(self.output_cols)
        if cols:
            return list(cols)
        return [f"{label}__output" for label in self.getLabelColumns() or []]

    def getFeatureColumns(self) -> List[str]:
        """The feature column names.

        Example::

            model.getFeatureColumns()     # ["features"]
        """
        return list(self.getOrDefault(self.feature_columns) or [])

    def getLabelColumns(self) -> List[str]:
        """The label column names.

        Example::

            model.getLabelColumns()     # ["label"]
        """
        return list(self.getOrDefault(self.label_columns) or [])

    # -- inference (the framework's hooks) ------------------------------------------------------

    @abstractmethod
    def _payload(self, model: Any) -> bytes:
        """What the predictor loads on the Spark workers (see the Predictor subclass)."""

    @abstractmethod
    def _sample_outputs(self, model: Any) -> List[Any]:
        """The model's outputs (anything with a ``.shape``, rows first) on two rows of zeros
        shaped like the training data (``getMetadata()["columns"]``)."""

    # -- inference -------------------------------------------------------------------------------

    def _output_sizes(self, model: Any) -> List[Optional[int]]:
        """Values per row of each output (None: one value, a double column)."""
        outputs = self._sample_outputs(model)
        labels = self.getLabelColumns()
        if len(outputs) != len(labels):
            raise InvalidArgumentError(
                f"the model returns {len(outputs)} outputs for {len(labels)} label columns: "
                "return one output per label"
            )
        sizes = []
        for out in outputs:
            per_row = 1
            for dim in tuple(out.shape)[1:]:
                per_row *= int(dim)
            sizes.append(None if per_row == 1 else per_row)
        return sizes

    def transform(self, df: Any = None, params: Any = None, *, dataset: Any = None) -> Any:
        """The DataFrame ``df`` with the prediction columns added (Horovod's
        ``transform(df, params=None)``; PySpark's keyword ``dataset=`` works too). ``params``
        overrides embedded parameters, as in Spark ML.

        Example::

            predictions = model.transform(df=test_df)
        """
        return super().transform(dataframe_argument(df, dataset, "transform"), params)

    def _transform(self, df: Any) -> Any:
        model = self.getModel()
        if model is None:
            raise InvalidArgumentError(f"this {type(self).__name__} has no model")
        return predict_columns(
            df,
            self.getFeatureColumns(),
            self.getOutputCols(),
            self._output_sizes(model),
            self._payload(model),
            self._predictor,
            self.getInferenceBatchSize(),
        )


#: Horovod's name of the trained models' base class
#: (``horovod.spark.common.estimator.HorovodModel``).
HorovodModel = KoloModel
