"""What an estimator's driver and its ranks exchange about training, for every framework and
launcher: rank 0's progress messages (:class:`ProgressReporter` on the rank, sent with
:func:`send_progress`; :class:`Progress` on the driver), where a resumed run starts
(:func:`resume_position`) and the timings a rank reports (:func:`rank_timings`).

Progress messages are dicts: ``{"kind": "step", "epoch": e, "step": s, "steps": n}`` (at most
every :data:`PROGRESS_INTERVAL_S` seconds) and ``{"kind": "epoch", "epoch": e, "epochs": n,
"metrics": {name: value}}`` after each epoch. They travel through the rank's kolo session
(the same under ``kolo.spark.run`` and ``kolo.ray.RayExecutor``); each launcher hands them to
the driver's :meth:`Progress.on_message`.

Example::

    progress = Progress(verbose=1, epochs=2)
    results = kolo.spark.run(train_fn, num_proc=2, _on_message=progress.on_message)
    progress.close()
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = [
    "PROGRESS_INTERVAL_S",
    "Progress",
    "ProgressReporter",
    "rank_result",
    "rank_timings",
    "resume_position",
    "send_progress",
]

log = logging.getLogger(__name__)

#: How often (seconds) rank 0 reports step progress to the driver.
PROGRESS_INTERVAL_S = 0.5


def send_progress(obj: Any) -> None:
    """Sends a progress message to the driver through this rank's kolo session (best effort: a
    rank outside a launcher's session, or a lost message, does not stop training).

    Example::

        send_progress({"kind": "epoch", "epoch": 0, "epochs": 1, "metrics": {}})
    """
    import cloudpickle

    from kolo import _native

    try:
        _native.session_send(cloudpickle.dumps(obj))
    except Exception as err:  # progress is best effort; training goes on
        log.debug("progress message not sent: %s", err)


class ProgressReporter:
    """Rank 0's side of :class:`Progress`: a ``step`` message when an epoch starts and then
    at most every :data:`PROGRESS_INTERVAL_S` seconds, an ``epoch`` message with the metrics
    when it ends; the other ranks send nothing.

    Example::

        reporter = ProgressReporter(send_progress, rank=hvd.rank(), epochs=3)
        reporter.epoch_started(0, steps=20)
        reporter.step_done(0, 1, steps=20)
        reporter.epoch_done(0, {"train_loss": 0.3})
    """

    def __init__(self, send: Callable[[Any], None], rank: int, epochs: int) -> None:
        self.send = send
        self.active = rank == 0
        self.epochs = epochs
        self.last_report = 0.0

    def epoch_started(self, epoch: int, steps: Optional[int]) -> None:
        """Reports step 0 of ``epoch`` (of ``steps``, None when unknown)."""
        if self.active:
            self.last_report = time.monotonic()
            self.send({"kind": "step", "epoch": epoch, "step": 0, "steps": steps})

    def step_done(self, epoch: int, done: int, steps: Optional[int]) -> None:
        """Reports ``done`` steps of ``epoch`` when the last report is old enough."""
        if not self.active:
            return
        now = time.monotonic()
        if now - self.last_report >= PROGRESS_INTERVAL_S:
            self.last_report = now
            self.send({"kind": "step", "epoch": epoch, "step": done, "steps": steps})

    def epoch_done(self, epoch: int, metrics: Dict[str, float]) -> None:
        """Reports the end of ``epoch`` with its (averaged) ``metrics``."""
        if self.active:
            self.send({"kind": "epoch", "epoch": epoch, "epochs": self.epochs, "metrics": metrics})


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
        """Shows ``message`` from ``rank`` (a launcher's message callback).

        Example::

            progress.on_message(0, {"kind": "epoch", "epoch": 0, "metrics": {"loss": 0.3}})
        """
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
        """Closes the open bar (the end of a run, or of an epoch).

        Example::

            progress.close()
        """
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


def rank_result(
    model: bytes, history: Dict[str, List[float]], start_epoch: int, size: int, timings: Any
) -> Dict[str, Any]:
    """What rank 0 returns to the driver when training ends: the trained ``model`` (bytes in
    the framework's format), the ``history``, the first epoch this run trained (> 0 when it
    resumed), the number of ranks and the ``timings`` (stamped with ``returned_unix``).

    Example::

        return rank_result(state_bytes(model), history, start_epoch, hvd.size(), timings)
    """
    timings["returned_unix"] = time.time()
    return {
        "model": model,
        "history": history,
        "start_epoch": start_epoch,
        "size": size,
        "timings": timings,
    }


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
