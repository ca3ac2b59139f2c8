"""Public names of a ``kolo.spark`` framework package, imported on first use: importing
``kolo.spark.torch`` (for its ``remote`` module, say) imports neither PySpark nor the framework
until ``TorchEstimator`` or ``TorchModel`` is asked for.

Example::

    __getattr__ = lazy_names(__name__, {"TorchEstimator": "kolo.spark.torch.estimator"})
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict


def lazy_names(package: str, homes: Dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``name`` from the module ``homes[name]``."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home), name)

    return __getattr__
