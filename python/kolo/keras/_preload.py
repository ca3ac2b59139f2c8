"""Loads triton (torch's compiler, when installed) before TensorFlow.

TensorFlow and triton each carry LLVM and register its global command-line options; when triton
loads second (``torch.compile``, ``torch._dynamo`` and ``torch.optim`` import it) the process
aborts with ``LLVM ERROR: inconsistency in registered CommandLine options`` (TensorFlow 2.21,
triton 3.9). Loaded first, both work. ``kolo.keras`` imports this module (which calls
:func:`load_triton_before_tensorflow`) before anything imports Keras (which imports TensorFlow
when it is installed), so processes that use Keras and torch together through kolo do not
abort.
"""

from __future__ import annotations

import importlib.util
import logging
import sys

log = logging.getLogger("kolo.keras")


def load_triton_before_tensorflow() -> None:
    """Imports triton when it is installed and TensorFlow is not loaded yet (0.2 s); a no-op
    otherwise.

    Example::

        load_triton_before_tensorflow()
        import keras  # TensorFlow now loads after triton
    """
    if "tensorflow" in sys.modules or "triton" in sys.modules:
        return
    try:
        if importlib.util.find_spec("triton") is None:
            return
        import triton  # noqa: F401
    except Exception as err:  # a broken triton must not stop Keras training
        log.debug("triton not preloaded: %s", err)


load_triton_before_tensorflow()
