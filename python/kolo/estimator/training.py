"""The driver's side of training on ranks, for every launcher: check that every rank gets at
least a batch, name the run, build the trainer, start the ranks through the launcher's
:data:`Launch` function while showing rank 0's progress, and hand back rank 0's result.

A launcher supplies only how ranks are started: ``launch(trainer, on_message)`` runs the
picklable ``trainer`` once on every rank, calls ``on_message(rank, message)`` with the
messages the ranks send (:mod:`kolo.estimator.progress`) while they run, and returns the
ranks' results in rank order (``kolo.spark.run``; ``RayExecutor.run`` with its driver's
messages).

Example::

    def launch(trainer, on_message):
        return kolo.spark.run(trainer, num_proc=2, _on_message=on_message)

    run = train_on_ranks(meta, lambda run_id: TorchTrainer(build_torch_spec(...)), launch,
                         ranks=2, ranks_param="num_proc", batch_size=32, run_id=None,
                         verbose=1, epochs=5)
    run.result["history"]
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from kolo.estimator.checks import check_rows_per_rank
from kolo.estimator.progress import Progress
from kolo.store import check_run_id

__all__ = ["Launch", "TrainingRun", "train_on_ranks"]

#: ``launch(trainer, on_message) -> results``: how a launcher runs ``trainer`` on every rank.
Launch = Callable[[Callable[[], Any], Callable[[int, Any], None]], List[Any]]


@dataclass
class TrainingRun:
    """What :func:`train_on_ranks` hands back.

    Example::

        run.run_id, run.result["model"], run.result["history"]
    """

    #: The run's id (the estimator's ``run_id``, or a new ``run_<milliseconds>``).
    run_id: str
    #: Rank 0's result: ``model``, ``history``, ``start_epoch``, ``size``, ``timings``.
    result: Dict[str, Any]
    #: Unix time the launcher was called.
    launched_unix: float


def train_on_ranks(
    meta: Any,
    make_trainer: Callable[[str], Callable[[], Any]],
    launch: Launch,
    *,
    ranks: int,
    ranks_param: str,
    batch_size: int,
    run_id: Optional[str],
    verbose: int,
    epochs: int,
) -> TrainingRun:
    """Trains on the prepared data ``meta`` on ``ranks`` ranks: checks ``run_id``
    (:class:`~kolo.exceptions.StoreError` unless it is one plain name, see
    :func:`kolo.store.check_run_id`) and that each rank gets a batch
    (:class:`~kolo.exceptions.DataError` naming ``ranks_param`` otherwise), builds the
    trainer with ``make_trainer(run_id)``, runs it with ``launch`` and shows rank 0's progress
    (a bar per epoch with ``verbose`` >= 1).

    Example::

        run = train_on_ranks(meta, make_trainer, launch, ranks=2, ranks_param="num_workers",
                             batch_size=32, run_id="run_1", verbose=1, epochs=3)
    """
    if run_id is not None:
        check_run_id(run_id)
    check_rows_per_rank(meta.train_rows, ranks, batch_size, ranks_param)
    run_id = run_id if run_id is not None else f"run_{int(time.time() * 1000)}"
    trainer = make_trainer(run_id)
    progress = Progress(verbose, epochs)
    launched = time.time()
    try:
        results = launch(trainer, progress.on_message)
    finally:
        progress.close()
    return TrainingRun(run_id=run_id, result=results[0], launched_unix=launched)
