"""Horovod's ``horovod.tensorflow.keras.callbacks``: :mod:`kolo.keras.callbacks`, whose
``BestModelCheckpoint`` here also takes ``save_weights_only`` (as this Horovod module's does).
"""

from typing import Any, Optional

from kolo.exceptions import ConfigError
from kolo.keras import callbacks as _keras_callbacks
from kolo.keras.callbacks import *  # noqa: F403 - the same names, under Horovod's module path
from kolo.keras.callbacks import __all__  # noqa: F401


class BestModelCheckpoint(_keras_callbacks.BestModelCheckpoint):
    """:class:`kolo.keras.callbacks.BestModelCheckpoint` with Horovod's ``save_weights_only``
    (then only the weights are saved, and ``filepath`` must end in ``.weights.h5``).

    Example::

        hvd.callbacks.BestModelCheckpoint(save_weights_only=True, filepath="best.weights.h5")
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: Any = "epoch",
        filepath: Optional[str] = None,
    ) -> None:
        super().__init__(
            monitor=monitor, verbose=verbose, mode=mode, save_freq=save_freq, filepath=filepath
        )
        self.save_weights_only = bool(save_weights_only)

    def on_train_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        """Checks the file to write (:class:`~kolo.exceptions.ConfigError`)."""
        if self.save_weights_only and not str(self.filepath or "").endswith(".weights.h5"):
            raise ConfigError(
                "BestModelCheckpoint(save_weights_only=True) saves weights: its filepath must "
                f"end in .weights.h5, got {self.filepath!r}"
            )
        super().on_train_begin(logs)
