"""Horovod's ``horovod.common`` paths on kolo: ``from kolo.common.exceptions import
HorovodInternalError`` works where a script wrote ``from horovod.common.exceptions import ...``.

The classes themselves live in :mod:`kolo.exceptions`; these modules only re-export them under
Horovod's names.

Example::

    from kolo.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
"""

__all__: list[str] = []
