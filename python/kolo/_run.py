"""``kolo.run``: Horovod's ``horovod.run`` — run a Python function on every rank of a job
started by the native kolorun launcher (locally or over ssh) and return the results by rank.

The pickled function travels to the ranks, and each result back, through the job's
authenticated driver service (never a file or a command line); every rank process runs
:func:`kolo._rank_process.rank_main`.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable, Optional, Sequence

from kolo import _native
from kolo._rank_process import rank_code
from kolo.exceptions import InvalidArgumentError, InvalidValueError, RankFailedError

#: What each rank process runs (``executable -c RANK_CODE``).
RANK_CODE = rank_code("kolo.run")


def run(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Optional[dict] = None,
    num_proc: Optional[int] = 1,
    min_num_proc: Optional[int] = None,
    max_num_proc: Optional[int] = None,
    slots: Optional[int] = None,
    reset_limit: Optional[int] = None,
    cooldown_range: Optional[Sequence[int]] = None,
    hosts: Optional[str] = None,
    hostfile: Optional[str] = None,
    host_discovery_script: Optional[str] = None,
    start_timeout: Optional[float] = None,
    ssh_port: Optional[int] = None,
    ssh_identity_file: Optional[str] = None,
    disable_cache: Optional[bool] = None,
    output_filename: Optional[str] = None,
    verbose: Optional[int] = None,
    use_gloo: Optional[bool] = None,
    use_mpi: Optional[bool] = None,
    mpi_args: Optional[str] = None,
    network_interface: Optional[str] = None,
    network_interfaces: Optional[Sequence[str]] = None,
    executable: Optional[str] = None,
    np: Optional[int] = None,
    min_np: Optional[int] = None,
    max_np: Optional[int] = None,
    *,
    elastic_timeout: Optional[int] = None,
) -> list[Any]:
    """Runs ``func(*args, **kwargs)`` on ``num_proc`` ranks and returns their results, ordered
    by rank — Horovod's ``horovod.run`` with the same parameters in the same order.

    The ranks are started by kolorun's launcher (``hosts``/``hostfile`` as ``-H``/
    ``--hostfile``; other hosts over ssh with ``ssh_port``/``ssh_identity_file``); their
    output comes back prefixed with the rank. Each rank sees the launching environment and the
    ``HOROVOD_*``/``KOLO_*`` rank variables before ``func`` is unpickled; ``func`` calls
    ``hvd.init()`` as usual. A rank that raises stops the others and ``run`` raises
    :class:`~kolo.exceptions.RankFailedError` with that rank's traceback. The elastic
    parameters are checked as kolorun checks their flags; an elastic run (``min_num_proc`` or
    ``host_discovery_script``) runs as ``kolorun --min-np ...`` does (see docs/elastic.md):
    ranks that fail leave the job while the others reset, hosts come and go, and the first
    rank to return ends the job; ``run`` then returns the results of the last round's ranks
    that returned one, ordered by rank. ``elastic_timeout`` (keyword only, seconds; not in
    Horovod, which reads ``HOROVOD_ELASTIC_TIMEOUT``) is ``--elastic-timeout``. ``use_gloo``,
    ``use_mpi`` and ``mpi_args`` are accepted as kolorun accepts their flags (a notice on
    stderr says what kolo does instead); ``np``, ``min_np``, ``max_np`` and
    ``network_interface`` are Horovod's deprecated spellings.

    Example::

        import kolo
        import kolo.torch as hvd

        def fn(scale):
            hvd.init()
            return hvd.rank() * scale

        assert kolo.run(fn, args=(10,), num_proc=2) == [0, 10]
    """
    if network_interface:
        network_interfaces = network_interface.split(",")
        warnings.warn(
            "network_interface is deprecated, use network_interfaces instead",
            DeprecationWarning,
            stacklevel=2,
        )
    for old, new in (("np", "num_proc"), ("min_np", "min_num_proc"), ("max_np", "max_num_proc")):
        value = locals()[old]
        if value is not None:
            warnings.warn(
                f"{old} is deprecated, use {new} instead", DeprecationWarning, stacklevel=2
            )
    num_proc = np if np is not None else num_proc
    min_num_proc = min_np if min_np is not None else min_num_proc
    max_num_proc = max_np if max_np is not None else max_num_proc
    if hosts is not None and hostfile is not None:
        raise InvalidValueError("Argument hosts and hostfile only allow one provided.")
    if use_gloo and use_mpi:
        raise InvalidValueError("Argument use_gloo and use_mpi only allow one set True.")
    if not callable(func):
        raise InvalidArgumentError(f"func must be callable, got {type(func).__name__}")
    argv = _command_line(
        num_proc=num_proc,
        min_num_proc=min_num_proc,
        max_num_proc=max_num_proc,
        slots=slots,
        reset_limit=reset_limit,
        cooldown_range=cooldown_range,
        hosts=hosts,
        hostfile=hostfile,
        host_discovery_script=host_discovery_script,
        start_timeout=start_timeout,
        ssh_port=ssh_port,
        ssh_identity_file=ssh_identity_file,
        disable_cache=disable_cache,
        output_filename=output_filename,
        verbose=verbose,
        use_gloo=use_gloo,
        use_mpi=use_mpi,
        mpi_args=mpi_args,
        network_interfaces=network_interfaces,
        elastic_timeout=elastic_timeout,
    )
    elastic = min_num_proc is not None or host_discovery_script is not None
    argv += ["--", executable or sys.executable, "-c", RANK_CODE]
    payload = _pickle(func, tuple(args), dict(kwargs or {}))
    code, results, failure = _native.kolorun_function(argv, payload)
    if code != 0 or failure is not None:
        raise _rank_failed(code, failure)
    import cloudpickle

    if elastic:
        # The ranks of the last round that returned (any returning rank ends the job).
        return [cloudpickle.loads(data) for data in results if data is not None]
    missing = [rank for rank, data in enumerate(results) if data is None]
    if missing:
        raise RankFailedError(
            f"kolo.run: rank {missing[0]} exited without returning a result",
            rank=missing[0],
        )
    return [cloudpickle.loads(data) for data in results]


def _command_line(**options: Any) -> list[str]:
    """The kolorun options for ``run``'s keyword arguments (None means not given)."""
    argv: list[str] = []
    flags = [
        ("num_proc", "-np"),
        ("min_num_proc", "--min-np"),
        ("max_num_proc", "--max-np"),
        ("slots", "--slots-per-host"),
        ("reset_limit", "--reset-limit"),
        ("hosts", "-H"),
        ("hostfile", "--hostfile"),
        ("host_discovery_script", "--host-discovery-script"),
        ("elastic_timeout", "--elastic-timeout"),
        ("start_timeout", "--start-timeout"),
        ("ssh_port", "--ssh-port"),
        ("ssh_identity_file", "--ssh-identity-file"),
        ("output_filename", "--output-filename"),
    ]
    for name, flag in flags:
        if options[name] is not None:
            argv.append(f"{flag}={options[name]}")
    if options["cooldown_range"] is not None:
        low, high = options["cooldown_range"]
        argv += ["--blacklist-cooldown-range", str(low), str(high)]
    for name, flag in [
        ("disable_cache", "--disable-cache"),
        ("verbose", "--verbose"),
        ("use_gloo", "--gloo"),
        ("use_mpi", "--mpi"),
    ]:
        if options[name]:
            argv.append(flag)
    if options["mpi_args"]:
        argv.append(f"--mpi-args={options['mpi_args']}")
    if options["network_interfaces"]:
        argv.append("--network-interfaces=" + ",".join(options["network_interfaces"]))
    return argv


def _pickle(func: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps((func, args, kwargs))
    except Exception as error:
        raise InvalidArgumentError(
            f"kolo.run cannot pickle func, args or kwargs ({type(error).__name__}: {error}); "
            "everything the function uses must be picklable with cloudpickle"
        ) from error


def _rank_failed(code: int, failure: Optional[tuple]) -> RankFailedError:
    if failure is None:
        return RankFailedError(f"kolo.run: a rank failed (kolorun exit code {code})")
    rank, host, message = failure
    where = f"rank {rank}" if rank is not None else "a rank"
    if host:
        where += f" on host {host}"
    return RankFailedError(
        f"kolo.run: {where} failed; the other ranks were stopped. Its error:\n{message}",
        rank=rank,
        host=host,
        remote_traceback=message,
    )
