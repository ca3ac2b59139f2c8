"""Typed errors raised by kolo.

Every error kolo raises derives from :class:`KoloError`; each names what went wrong and how to
fix it. The classes are declared by the native module (so Rust errors map onto them once, at
the edge) and re-exported here; they pickle by reference to this module.

They are also the Python builtins Horovod raises, so code written for Horovod catches them:

- a collective that fails raises :class:`InternalError`, a ``RuntimeError`` and the very class
  :data:`HorovodInternalError` names (``kolo.common.exceptions.HorovodInternalError`` too). In
  Horovod every op failure surfaces from ``synchronize`` as ``HorovodInternalError``, so kolo's
  finer classes are its subclasses: :class:`MismatchError` (the ranks disagreed),
  :class:`JobAbortedError` (another rank failed), :class:`PeerConnectionError` (a peer's
  connection broke), and :class:`TimeoutError` (a bounded wait ran out, e.g. a stalled
  collective, for which Horovod raises ``HorovodInternalError`` too);
- a bad argument raises :class:`InvalidArgumentError`, a ``ValueError`` (Horovod's argument
  checks raise ``ValueError``), as does :class:`NotInitializedError`; a Horovod feature kolo
  cannot run as asked (Adasum on 3 ranks) raises :class:`NotSupportedError`, a
  ``NotImplementedError`` too;
- :class:`HostsUpdatedInterrupt` is Horovod's elastic interrupt (a ``RuntimeError``).

Example::

    import kolo.torch as hvd
    from kolo.exceptions import HorovodInternalError, MismatchError

    try:
        hvd.allreduce(tensor)
    except MismatchError as err:       # or RuntimeError, or HorovodInternalError
        print("ranks disagreed:", err)
"""

import builtins

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

# TensorFlow's AutoGraph re-raises an error raised while it traces a ``tf.function`` with the
# error's own type only when that type's ``__init__`` is ``Exception.__init__``; any other
# becomes a ``StagingError`` and ``except kolo.exceptions.X`` would miss it. The builtin bases
# (``ValueError``, ``RuntimeError``, ...) bring their own ``__init__``, which behaves the same.
KoloError.__init__ = Exception.__init__  # type: ignore[misc]


class NotInitializedError(KoloError, ValueError):
    """A kolo call needs ``hvd.init()`` first (a ``ValueError`` too, as Horovod raises)."""


class InvalidValueError(InvalidArgumentError, ValueError):
    """An argument has an invalid value where Horovod raises ``ValueError`` (e.g.
    ``RayExecutor(settings, num_workers=2, num_hosts=2)``); a ``ValueError``, like every
    :class:`InvalidArgumentError`.

    Example::

        try:
            RayExecutor(settings)
        except ValueError as err:
            print(err)  # Either `num_workers` or `num_hosts` must be set.
    """


class NotSupportedError(InvalidArgumentError, NotImplementedError):
    """A Horovod feature kolo cannot run as asked was asked for (``op=hvd.Adasum`` on a number
    of ranks that is not a power of two, or with reducescatter); the message says what works
    instead. A ``NotImplementedError`` (so a ``RuntimeError``), as Horovod raises where it cannot
    run Adasum, and an :class:`InvalidArgumentError` (a ``ValueError``).

    Example::

        try:
            hvd.allreduce(grad, op=hvd.Adasum)  # on 3 ranks
        except NotImplementedError as err:
            print(err)  # Running Adasum with non-power of 2 ranks is not supported yet: ...
    """


class PlacementGroupTimeoutError(TimeoutError, builtins.TimeoutError):
    """``RayExecutor.start()`` could not get its placement group within
    ``placement_group_timeout_s``; the message gives the resources asked for and those
    available. A :class:`TimeoutError` of kolo and Python's builtin ``TimeoutError`` too.

    Attributes: ``requested`` (the bundles), ``available`` (``ray.available_resources()`` when
    it gave up) and ``timeout_s``.

    Example::

        try:
            executor.start()
        except PlacementGroupTimeoutError as err:
            print(err.requested, err.available)
    """

    def __init__(
        self,
        message: str,
        requested: "list[dict[str, float]] | None" = None,
        available: "dict[str, float] | None" = None,
        timeout_s: "float | None" = None,
    ) -> None:
        super().__init__(message)
        self.requested = requested or []
        self.available = available or {}
        self.timeout_s = timeout_s

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):  # type: ignore[override]
        return (type(self), (str(self), self.requested, self.available, self.timeout_s))


class NotEnoughSlotsError(LaunchError):
    """The Spark cluster cannot run ``num_proc`` tasks at once (a barrier stage needs them all
    together); the message says how many slots there are and how to get more."""


class MissingArgumentError(InvalidArgumentError, TypeError):
    """A required argument was not given (a ``TypeError`` too, as Python raises for a missing
    argument); the message names it and how to give it.

    Example::

        try:
            Store()
        except TypeError as err:
            print(err)  # Store needs a prefix_path: kolo's stores are concrete, ...
    """


class FrameworkVersionError(ConfigError, RuntimeError):
    """An installed framework is older than kolo supports (a ``RuntimeError`` too, as Horovod
    raises for, e.g., a Lightning older than ``MIN_PL_VERSION``); the message names the version
    found, the one needed and the install command.

    Example::

        try:
            TorchEstimator(model=model, store=store)
        except RuntimeError as err:
            print(err)  # kolo's Lightning estimator needs lightning>=2.0.0, found ...
    """


class RankFailedError(LaunchError, RuntimeError):
    """A rank of ``kolo.run``, ``kolo.spark.run`` or a ``RayExecutor`` raised or died; the others
    were stopped. A ``RuntimeError`` too, as ``horovod.run`` raises ("Horovod detected that one or
    more processes exited with non-zero status").

    Attributes: ``rank`` (None when it failed before ranks were assigned), ``host`` (on Ray the
    node: IP and node id), ``task_index`` (the Spark partition, the Ray actor's index),
    ``task_attempt`` (Spark's attempt number; 0 on Ray) and ``remote_traceback`` (the rank's
    traceback, or how its process ended).

    Example::

        try:
            kolo.spark.run(fn, num_proc=2)
        except RankFailedError as err:
            print(err.rank, err.host, err.remote_traceback)
    """

    def __init__(
        self,
        message: str,
        rank: "int | None" = None,
        host: str = "",
        task_index: "int | None" = None,
        task_attempt: "int | None" = None,
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.host = host
        self.task_index = task_index
        self.task_attempt = task_attempt
        self.remote_traceback = remote_traceback

    def __reduce__(self):  # type: ignore[override]
        return (
            type(self),
            (
                str(self),
                self.rank,
                self.host,
                self.task_index,
                self.task_attempt,
                self.remote_traceback,
            ),
        )


class HostsUpdatedInterrupt(KoloError, RuntimeError):
    """Horovod's elastic interrupt: the set of hosts in the job changed, so the training loop
    resets without restoring the last committed state (a ``RuntimeError``, as in
    ``horovod/common/exceptions.py``). ``skip_sync`` says whether the state sync after the reset
    can be skipped.

    Example::

        try:
            train(state)
        except HostsUpdatedInterrupt as interrupt:
            reset(sync=not interrupt.skip_sync)
    """

    def __init__(self, skip_sync: bool) -> None:
        super().__init__(skip_sync)
        self.skip_sync = skip_sync


class ResetLimitExceededError(KoloError, RuntimeError):
    """An elastic job reset more often than its reset limit allows (``--reset-limit``,
    ``reset_limit=`` of the launchers): the job driver stopped the job instead of one more
    reset, as Horovod's driver does ("number of resets during elastic job exceeded limit"), and
    a rank's ``hvd.elastic.run`` raises this from the driver's error (its ``__cause__``). A
    ``RuntimeError`` too.

    Attributes: ``limit`` (the limit) and ``resets`` (the resets done).

    Example::

        try:
            train(state)
        except ResetLimitExceededError as err:
            print(err.limit, err.__cause__)
    """

    def __init__(self, limit: int, resets: "int | None" = None) -> None:
        self.limit = limit
        self.resets = limit if resets is None else resets
        super().__init__(
            f"kolo was shut down because the number of resets during the elastic job exceeded "
            f"the limit: {limit} (resets done: {self.resets}); raise the reset limit "
            f"(kolorun --reset-limit, reset_limit=) or find why the workers keep failing "
            f"(the cause is below)"
        )

    def __reduce__(self):  # type: ignore[override]
        return (type(self), (self.limit, self.resets))


#: Horovod's name for a failed collective: the same class as :class:`InternalError`, so
#: ``except HorovodInternalError`` catches every collective failure (mismatches, a dead peer,
#: an aborted job), as Horovod's ``synchronize`` raises it for all of them.
HorovodInternalError = InternalError

__all__ = [
    "ConfigError",
    "DataError",
    "FrameworkVersionError",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "InternalError",
    "InvalidArgumentError",
    "InvalidValueError",
    "JobAbortedError",
    "KoloError",
    "LaunchError",
    "MismatchError",
    "MissingArgumentError",
    "NotEnoughSlotsError",
    "NotInitializedError",
    "NotSupportedError",
    "PeerConnectionError",
    "PlacementGroupTimeoutError",
    "RankFailedError",
    "RendezvousError",
    "ResetLimitExceededError",
    "StoreError",
    "TimeoutError",
]
