"""Horovod's ``horovod.common`` paths on kolo, so imports written for Horovod work with
``horovod`` replaced by ``kolo``: ``kolo.common.exceptions`` (``HorovodInternalError``, ...),
``kolo.common.process_sets`` and ``kolo.common.util`` (the ``horovod.common.util`` helpers
scripts and test suites import: ``gloo_built``, ``mpi_built``, ``env``, ...).

The classes and functions themselves live in :mod:`kolo.exceptions`, :mod:`kolo.process_sets`
and :mod:`kolo`; these modules only re-export them under Horovod's names.

Example::

    from kolo.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
    from kolo.common.process_sets import ProcessSet, add_process_set
"""

__all__: list[str] = []
