"""Typed errors raised by kolo.

Every error kolo raises derives from :class:`KoloError`; each names what went wrong and how to
fix it. The classes are declared by the native module (so Rust errors map onto them once, at
the edge) and re-exported here; they pickle by reference to this module.

Example::

    import kolo.torch as hvd
    from kolo.exceptions import MismatchError

    try:
        hvd.allreduce(tensor)
    except MismatchError as err:
        print("ranks disagreed:", err)
"""

from kolo._native import (
    ConfigError,
    DataError,
    InternalError,
    InvalidArgumentError,
    JobAbortedError,
    KoloError,
    LaunchError,
    MismatchError,
    PeerConnectionError,
    RendezvousError,
    StoreError,
    TimeoutError,
)


class NotInitializedError(KoloError, ValueError):
    """A kolo call needs ``hvd.init()`` first (a ``ValueError`` too, as Horovod raises)."""


#: Horovod's name for a failure inside a collective (elastic training catches it).
HorovodInternalError = InternalError

__all__ = [
    "ConfigError",
    "DataError",
    "HorovodInternalError",
    "InternalError",
    "InvalidArgumentError",
    "JobAbortedError",
    "KoloError",
    "LaunchError",
    "MismatchError",
    "NotInitializedError",
    "PeerConnectionError",
    "RendezvousError",
    "StoreError",
    "TimeoutError",
]
