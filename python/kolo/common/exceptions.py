"""Horovod's ``horovod.common.exceptions`` on kolo: the same names, the same builtin bases.

- :class:`HorovodInternalError` is :class:`kolo.exceptions.InternalError` (a ``RuntimeError``):
  every failed collective raises it or a subclass of it (``MismatchError``, ``JobAbortedError``,
  ``PeerConnectionError``), as Horovod's ``synchronize`` raises ``HorovodInternalError`` for
  every op failure.
- :class:`HostsUpdatedInterrupt` (a ``RuntimeError``) takes ``skip_sync`` as in Horovod.
- :class:`HorovodVersionMismatchError` (an ``ImportError``) is accepted for ``except`` clauses;
  kolo never raises it, since its one wheel works with every installed framework version.

Example::

    from kolo.common.exceptions import HorovodInternalError

    try:
        hvd.allreduce(grad)
    except HorovodInternalError:
        state.restore()
"""

from kolo.exceptions import HorovodInternalError, HostsUpdatedInterrupt


def get_version_mismatch_message(name: str, version: str, installed_version: str) -> str:
    """Horovod's message for a framework whose version differs from the one it was built
    against (the text of :class:`HorovodVersionMismatchError`).

    Example::

        get_version_mismatch_message("torch", "2.5.0", "2.4.0")
    """
    return (
        f"Framework {name} installed with version {installed_version} but found version "
        f"{version}.\nThis can result in unexpected behavior including runtime errors."
    )


class HorovodVersionMismatchError(ImportError):
    """Horovod's error for a framework whose version differs from the one Horovod was built
    against. kolo builds against no framework, so it never raises this; the class exists so
    that ``except HorovodVersionMismatchError`` in Horovod scripts keeps working.

    Example::

        try:
            import kolo.torch as hvd
        except HorovodVersionMismatchError as err:
            print(err.name, err.version, err.installed_version)
    """

    def __init__(self, name: str, version: str, installed_version: str) -> None:
        super().__init__(get_version_mismatch_message(name, version, installed_version))
        self.name = name
        self.version = version
        self.installed_version = installed_version

    def __reduce__(self):  # type: ignore[override]
        return (type(self), (self.name, self.version, self.installed_version))


__all__ = [
    "HorovodInternalError",
    "HorovodVersionMismatchError",
    "HostsUpdatedInterrupt",
    "get_version_mismatch_message",
]
