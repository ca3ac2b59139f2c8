"""kolo: Horovod-style data-parallel training for Spark and Ray on a Rust core.

Frameworks live in submodules; ``import kolo.torch as hvd`` gives the Horovod PyTorch API.
"""

from kolo._native import __version__

__all__ = ["__version__"]
