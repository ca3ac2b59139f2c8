"""What a torch worker added to a running elastic job loads before it registers."""

from __future__ import annotations

import importlib
import sys


def warm_torch_for_joining() -> None:
    """Imports ``torch._dynamo``: torch's optimizers import it at their first use (about as
    long as importing torch itself), which in a joining worker would come after its
    registration, while the running ranks wait for its first step. Skipped when TensorFlow is
    loaded: it and the Triton that ``torch._dynamo`` brings cannot share a process (two LLVMs).

    Example::

        kolo._lifecycle.warm_before_joining(warm_torch_for_joining)
    """
    if "tensorflow" in sys.modules:
        return
    importlib.import_module("torch._dynamo")
