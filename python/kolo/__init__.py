"""kolo: Horovod-style data-parallel training for Spark and Ray on a Rust core.

Frameworks live in submodules; ``import kolo.torch as hvd`` gives the Horovod PyTorch API.
Here: ``__version__``, the process sets (:class:`ProcessSet`, ``global_process_set``: every
rank), :func:`engine_stats`, and :func:`run` (Horovod's ``horovod.run``: a function on every
rank of a job kolorun's launcher starts).

Example::

    import kolo

    print(kolo.__version__, kolo.global_process_set.size())
"""

from kolo._core import engine_stats
from kolo._native import __version__
from kolo._run import run
from kolo.process_sets import ProcessSet, global_process_set

__all__ = ["ProcessSet", "__version__", "engine_stats", "global_process_set", "run"]
