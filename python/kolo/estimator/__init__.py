"""kolo's estimator core: the launcher-neutral half of the estimators, beside the Rust
``estimator/`` crate it drives.

It owns what every estimator does whatever starts its ranks:

- the one parameter table (:mod:`kolo.estimator.params`) and the driver-side checks
  (:mod:`kolo.estimator.checks`), typed :mod:`kolo.exceptions` errors before any data is
  written or any rank starts;
- the prepared data as the estimators see it (:mod:`kolo.estimator.dataset`);
- the spec a rank trains from (:class:`TrainingSpec`, extended by each framework) and the
  per-rank training loops: :class:`TorchTrainer`, :class:`LightningTrainer`,
  :class:`KerasTrainer`, with resume from the run's checkpoint;
- progress (rank 0's messages, the driver's bars) and rank timings
  (:mod:`kolo.estimator.progress`), and the driver's flow around a launch
  (:func:`train_on_ranks`).

What a launcher supplies is passed in, never imported: how ranks start (the ``launch``
function of :func:`train_on_ranks`); how progress reaches the driver (the rank's kolo session,
which every launcher provides, or ``send=``); which GPU a rank owns (the launcher's
``KOLO_GPU_ADDRESSES`` in the rank's environment, see :mod:`kolo._rank_gpu`).
:mod:`kolo.spark` (Spark ML Params and DataFrames) and :mod:`kolo.ray` (Ray Datasets and
actors) are thin adapters on top. Importing this package imports neither PySpark, Ray nor a
framework.

Example::

    from kolo.estimator import TorchTrainer, build_torch_spec, train_on_ranks

    def launch(trainer, on_message):
        return kolo.spark.run(trainer, num_proc=2, _on_message=on_message)

    run = train_on_ranks(meta, lambda run_id: TorchTrainer(build_torch_spec(
        params.get, store, run_id, meta)), launch, ranks=2, ranks_param="num_proc",
        batch_size=32, run_id=None, verbose=1, epochs=5)
"""

from kolo.estimator.dataset import PreparedDataset, describe_dataset, get_dataset_metadata
from kolo.estimator.keras_trainer import KerasSpec, KerasTrainer
from kolo.estimator.lightning_trainer import LightningSpec, LightningTrainer
from kolo.estimator.progress import Progress, ProgressReporter
from kolo.estimator.spec import TrainingSpec, spec_fields
from kolo.estimator.torch_spec import TorchSpec, build_torch_spec
from kolo.estimator.torch_trainer import TorchTrainer
from kolo.estimator.training import TrainingRun, train_on_ranks

__all__ = [
    "KerasSpec",
    "KerasTrainer",
    "LightningSpec",
    "LightningTrainer",
    "PreparedDataset",
    "Progress",
    "ProgressReporter",
    "TorchSpec",
    "TorchTrainer",
    "TrainingRun",
    "TrainingSpec",
    "build_torch_spec",
    "describe_dataset",
    "get_dataset_metadata",
    "spec_fields",
    "train_on_ranks",
]
