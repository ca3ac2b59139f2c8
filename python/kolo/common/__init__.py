"""Horovod's ``horovod.common`` paths on kolo, so imports written for Horovod work with
``horovod`` replaced by ``kolo``: ``kolo.common.process_sets``.

Example::

    from kolo.common.process_sets import ProcessSet, add_process_set
"""

__all__: list[str] = []
