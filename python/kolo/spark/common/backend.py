"""How an estimator starts its training function on ranks (Horovod's
``horovod.spark.common.backend``).

:class:`Backend` is the interface: ``run(fn, args, kwargs, env)`` runs ``fn`` once per rank and
returns the results ordered by rank; ``num_processes()`` says how many ranks. A kolo estimator
given ``backend=`` trains through it (its ``num_proc`` comes from the backend, and giving both
``backend`` and ``num_proc`` is a ``ValueError``, as in Horovod), so a custom backend that
launches the ranks elsewhere works as it does with Horovod.

:class:`SparkBackend` runs through :func:`kolo.spark.run`; its keyword arguments are
:func:`kolo.spark.run`'s (``stdout``, ``stderr``, ``verbose``, ``nics``, ``start_timeout``,
``prefix_output_with_timestamp``, ``use_mpi``, ``use_gloo``, ``extra_mpi_args``,
``executable``), checked when the backend is built.

Example::

    from kolo.spark.common.backend import SparkBackend
    from kolo.spark.torch import TorchEstimator

    backend = SparkBackend(num_proc=2, stdout=sys.stdout, stderr=sys.stderr,
                           prefix_output_with_timestamp=True)
    est = TorchEstimator(backend=backend, store=store, model=model, ...)
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable, Optional

from kolo.exceptions import InvalidArgumentError

__all__ = ["Backend", "SparkBackend", "default_num_proc"]

#: ``kolo.spark.run`` parameters a ``SparkBackend`` sets itself (not through ``**kwargs``).
_OWN_RUN_PARAMS = ("fn", "args", "kwargs", "num_proc", "env")
#: Any of these makes a ``SparkBackend`` elastic: it runs through ``kolo.spark.run_elastic``.
ELASTIC_BOUNDS = ("min_num_proc", "max_num_proc")


def default_num_proc() -> int:
    """Spark's default parallelism: ``spark.sparkContext.defaultParallelism`` of the active
    Spark context, or on a Spark Connect session (no ``SparkContext``) the server's
    (:meth:`kolo.spark._session.ConnectSpark.default_parallelism`).

    Example::

        num_proc = default_num_proc()   # e.g. 2 on local[2]
    """
    from kolo.spark._session import spark_target

    return int(spark_target().default_parallelism())


class Backend:
    """The interface for running the distributed training function (Horovod's ``Backend``).

    Subclass it when training runs somewhere other than the Spark application that holds the
    estimator; implement :meth:`run` and :meth:`num_processes`.

    Example::

        class LocalBackend(Backend):
            def run(self, fn, args=(), kwargs={}, env=None):
                return kolo.spark.run(fn, args=args, kwargs=kwargs, num_proc=2, env=env)

            def num_processes(self):
                return 2
    """

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: Optional[dict] = None,
        env: Optional[dict[str, str]] = None,
    ) -> list[Any]:
        """Runs ``fn(*args, **kwargs)`` on every rank; returns the results ordered by rank.

        Example::

            results = backend.run(fn, args=(1,), env={"MY_VAR": "x"})
        """
        raise NotImplementedError()

    def num_processes(self) -> int:
        """The number of ranks training runs on.

        Example::

            assert backend.num_processes() == 2
        """
        raise NotImplementedError()


class SparkBackend(Backend):
    """Runs the training function with :func:`kolo.spark.run` (Horovod's ``SparkBackend``).

    Args:
        num_proc: the number of ranks; default ``spark.sparkContext.defaultParallelism``
            (read when the backend is built, so a Spark session must be active then).
        env: the ranks' environment; default a copy of this process's ``os.environ``, as in
            Horovod. ``run(..., env=...)`` adds to it; ``CUDA_VISIBLE_DEVICES`` is dropped
            (each rank's GPUs come from its Spark task).
        **kwargs: further arguments of :func:`kolo.spark.run` (``stdout``, ``stderr``,
            ``verbose``, ``nics``, ``start_timeout``, ``prefix_output_with_timestamp``,
            ``use_mpi``, ``use_gloo``, ``extra_mpi_args``, ``executable``); an unknown name
            raises :class:`~kolo.exceptions.InvalidArgumentError` here. With elastic bounds
            (``min_num_proc`` and/or ``max_num_proc``, Horovod's ``run_elastic`` names) the
            backend runs through :func:`kolo.spark.run_elastic` and takes its arguments
            instead (``elastic_timeout``, ``reset_limit``, ...): an estimator fit through it
            survives the loss of ranks (kolo's addition; Horovod's estimators are not elastic).

    Example::

        backend = SparkBackend(num_proc=2, stdout=sys.stdout, verbose=2)
        results = backend.run(lambda: 42)     # [42, 42]

        elastic = SparkBackend(num_proc=2, min_num_proc=1, max_num_proc=2)
        model = TorchEstimator(backend=elastic, store=store, model=model, ...).fit(df)
    """

    def __init__(
        self, num_proc: Optional[int] = None, env: Optional[dict[str, str]] = None, **kwargs: Any
    ) -> None:
        from kolo.spark.runner import run, run_elastic

        self._elastic = any(kwargs.get(name) is not None for name in ELASTIC_BOUNDS)
        launcher = run_elastic if self._elastic else run
        name = "kolo.spark.run_elastic" if self._elastic else "kolo.spark.run"
        known = [p for p in inspect.signature(launcher).parameters if not p.startswith("_")]
        allowed = [p for p in known if p not in (*_OWN_RUN_PARAMS, "min_np", "max_np")]
        if not self._elastic:
            kwargs = {k: v for k, v in kwargs.items() if k not in ELASTIC_BOUNDS}
        unknown = sorted(set(kwargs) - set(allowed))
        if unknown:
            raise InvalidArgumentError(
                f"SparkBackend got {', '.join(map(repr, unknown))}, which {name} does "
                f"not take; its arguments are: {', '.join(allowed)}"
            )
        if env is not None and not isinstance(env, dict):
            raise InvalidArgumentError(
                f"SparkBackend(env=...) must be a dict of environment variables, got "
                f"{type(env).__name__}"
            )
        self._num_proc = num_proc or default_num_proc()
        self._env = env
        self._kwargs = kwargs

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: Optional[dict] = None,
        env: Optional[dict[str, str]] = None,
        *,
        _on_message: Optional[Callable[[int, Any], None]] = None,
        _on_launch_report: Optional[Callable[[Any], None]] = None,
    ) -> list[Any]:
        """Runs ``fn`` on :meth:`num_processes` ranks with :func:`kolo.spark.run`
        (``_on_launch_report`` gets its launch report; an elastic backend has none).

        Example::

            results = SparkBackend(num_proc=2).run(fn, args=(3,))
        """
        from kolo.spark.runner import run, run_elastic

        full_env = dict(self._env or os.environ)
        if env:
            full_env.update(env)
        full_env.pop("CUDA_VISIBLE_DEVICES", None)
        if not self._elastic:
            # The elastic launchers' mark for their workers: not for the ranks of a fixed job.
            full_env.pop("KOLO_ELASTIC_TIMEOUT", None)
        common = dict(
            args=args,
            kwargs=kwargs,
            num_proc=self._num_proc,
            env=full_env,
            _on_message=_on_message,
            **self._kwargs,
        )
        if self._elastic:
            return run_elastic(fn, **common)
        return run(fn, _on_launch_report=_on_launch_report, **common)

    def num_processes(self) -> int:
        """``num_proc`` as given, or Spark's default parallelism.

        Example::

            SparkBackend(num_proc=4).num_processes()   # 4
        """
        return self._num_proc
