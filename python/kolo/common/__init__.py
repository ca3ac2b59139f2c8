"""Horovod's ``horovod.common`` paths on kolo: ``from kolo.common.exceptions import
HorovodInternalError`` works where a script wrote ``from horovod.common.exceptions import ...``,
and ``kolo.common.util`` has the ``horovod.common.util`` helpers scripts and test suites import
(``gloo_built``, ``mpi_built``, ``env``, ...).

The exception classes themselves live in :mod:`kolo.exceptions`; ``kolo.common.exceptions``
only re-exports them under Horovod's names.

Example::

    from kolo.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
"""

__all__: list[str] = []
