"""Horovod's ``horovod.common.process_sets`` on kolo: the very classes and functions of
:mod:`kolo.process_sets` under Horovod's module path.

Example::

    import kolo.torch as hvd
    from kolo.common.process_sets import ProcessSet, add_process_set

    evens = ProcessSet([0, 2])
    hvd.init(process_sets=[evens])
    add_process_set([1, 3])
"""

from kolo.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]
