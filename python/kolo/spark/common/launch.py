"""What the driver of an estimator and its ranks under :func:`kolo.spark.run` exchange, for
every framework: rank 0's progress messages (:func:`spark_send` on the rank, :class:`Progress`
on the driver) and the GPU a rank trains on (:func:`spark_gpu_index`).

Progress messages are dicts: ``{"kind": "step", "epoch": e, "step": s, "steps": n}`` (at most
every :data:`PROGRESS_INTERVAL_S` seconds) and ``{"kind": "epoch", "epoch": e, "epochs": n,
"metrics": {name: value}}`` after each epoch.

Example::

    progress = Progress(verbose=1, epochs=2)
    results = kolo.spark.run(train_fn, num_proc=2, _on_message=progress.on_message)
    progress.close()
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Tuple

__all__ = [
    "PROGRESS_INTERVAL_S",
    "Progress",
    "rank_timings",
    "resume_position",
    "spark_gpu_index",
    "spark_send",
]

log = logging.getLogger(__name__)

#: How often (seconds) rank 0 reports step progress to the driver.
PROGRESS_INTERVAL_S = 0.5


def spark_gpu_index(local_rank: int) -> int:
    """The GPU of a rank under ``kolo.spark.run``: the Spark task's first GPU address, else
    ``local_rank`` (the default ``gpu_index`` of the estimators' remote trainers).

    Example::

        spark_gpu_index(0)   # 0 outside Spark or without GPU resources
    """
    try:
        from kolo.spark.task import get_available_devices

        devices = get_available_devices()
        if devices:
            return int(devices[0])
    except Exception as err:  # not under kolo.spark.run, or no resources
        log.debug("no Spark GPU assignment (%s); using local_rank %d", err, local_rank)
    return local_rank


def spark_send(obj: Any) -> None:
    """Sends a progress message to the driver of ``kolo.spark.run`` (best effort; the default
    ``send`` of the estimators' remote trainers).

    Example::

        spark_send({"kind": "epoch", "epoch": 0, "epochs": 1, "metrics": {}})
    """
    try:
        from kolo.spark.task import send_to_driver
    except ImportError:
        return
    try:
        send_to_driver(obj)
    except Exception as err:  # progress is best effort; training goes on
        log.debug("progress message not sent: %s", err)


class Progress:
    """The driver's view of training: one tqdm bar per epoch with the averaged metrics (log
    lines when tqdm is not installed), fed with rank 0's messages by ``on_message(rank, msg)``.

    Example::

        progress = Progress(verbose=1, epochs=3)
        progress.on_message(0, {"kind": "step", "epoch": 0, "step": 5, "steps": 20})
        progress.close()
    """

    def __init__(self, verbose: int, epochs: int) -> None:
        self.verbose = verbose
        self.epochs = epochs
        self.bar = None
        self.bar_epoch = None
        self.first_message_at: Optional[float] = None
        try:
            import tqdm

            self.tqdm = tqdm.tqdm
        except ImportError:
            self.tqdm = None

    def _bar(self, epoch: int, steps: Optional[int]) -> Any:
        if self.bar_epoch != epoch:
            self.close()
            self.bar_epoch = epoch
            if self.tqdm is not None:
                self.bar = self.tqdm(
                    total=steps,
                    desc=f"epoch {epoch + 1}/{self.epochs}",
                    unit="step",
                    leave=True,
                )
        return self.bar

    def on_message(self, rank: int, message: Any) -> None:
        if self.first_message_at is None:
            self.first_message_at = time.time()
        if self.verbose < 1 or not isinstance(message, dict):
            return
        epoch = message.get("epoch", 0)
        if message.get("kind") == "step":
            bar = self._bar(epoch, message.get("steps"))
            if bar is not None:
                bar.update(max(0, message["step"] - bar.n))
        elif message.get("kind") == "epoch":
            metrics = message.get("metrics", {})
            bar = self._bar(epoch, None)
            if bar is not None:
                if bar.total:
                    bar.update(max(0, bar.total - bar.n))
                bar.set_postfix({k: f"{v:.4g}" for k, v in metrics.items()})
                self.close()
            else:
                text = ", ".join(f"{k}={v:.4g}" for k, v in metrics.items())
                log.info("epoch %d/%d: %s", epoch + 1, self.epochs, text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def resume_position(
    train_loader: Any, resume: Dict[str, Any]
) -> Tuple[int, Dict[str, List[float]]]:
    """Puts ``train_loader`` where a run's checkpoint left it (``resume["loader"]``; a loader
    of data prepared again starts its epoch afresh) and returns the epoch to start at and the
    history so far.

    Example::

        start_epoch, history = resume_position(loader, {"epoch": 0, "history": {}})
    """
    if resume.get("loader"):
        try:
            train_loader.load_state_dict(resume["loader"])
        except Exception as err:  # the data was prepared again: start its epoch afresh
            log.warning("loader position not restored (%s)", err)
    history = {k: list(v) for k, v in (resume.get("history") or {}).items()}
    return int(resume["epoch"]), history


def rank_timings(started: float, started_unix: float) -> Dict[str, Any]:
    """The timings a rank reports (filled in while it trains): when it started and how long
    its setup took since ``started`` (``time.monotonic()``).

    Example::

        timings = rank_timings(time.monotonic(), time.time())
    """
    return {
        "started_unix": started_unix,
        "setup_s": time.monotonic() - started,
        "train_s": 0.0,
        "checkpoint_s": 0.0,
        "first_step_unix": None,
    }
