"""Horovod's ``horovod.ray.elastic``: :class:`ElasticRayExecutor` (Horovod's older elastic Ray
API, deprecated there since 0.25 in favour of ``RayExecutor(min_workers=...)``) and
:class:`RayHostDiscovery`.

Both run on the same elastic machinery as :class:`kolo.ray.RayExecutor` with ``min_workers``
(see docs/elastic.md). Importing this module does not import Ray.

Example::

    import ray
    from kolo.ray.elastic import ElasticRayExecutor

    ray.init(address="auto")
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=4)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    results = executor.run(train_fn)     # train_fn() uses hvd.elastic.run
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, List, Optional

from kolo.exceptions import InvalidArgumentError, InvalidValueError
from kolo.ray._hosts import RayHostDiscovery

__all__ = ["ElasticRayExecutor", "ElasticRaySettings", "RayHostDiscovery"]

#: The keyword arguments ``create_settings`` takes beyond its own (Horovod's ``BaseSettings``
#: and ``ElasticSettings`` ones); those about ssh/MPI are accepted and unused.
_SETTINGS_KWARGS = frozenset(
    {
        "verbose",
        "ssh_port",
        "extra_mpi_args",
        "tcp_flag",
        "binding_args",
        "key",
        "start_timeout",
        "output_filename",
        "run_func_mode",
        "prefix_output_with_timestamp",
        "cooldown_range",
        "discovery",
        "placement_group_timeout_s",
    }
)


@dataclasses.dataclass
class ElasticRaySettings:
    """What :meth:`ElasticRayExecutor.create_settings` returns (Horovod's ``ElasticSettings``):
    ``min_num_proc``/``max_num_proc`` workers, ``reset_limit``, ``elastic_timeout`` and
    ``cooldown_range`` as for ``RayExecutor(min_workers=...)``; ``timeout_s`` for a worker to
    start; ``nics`` for the job driver's address; ``discovery`` (set by the executor unless
    ``override_discovery=False``)."""

    min_num_proc: int = 1
    max_num_proc: Optional[int] = None
    reset_limit: Optional[int] = None
    elastic_timeout: float = 600
    timeout_s: float = 30
    ssh_identity_file: Optional[str] = None
    nics: Optional[Any] = None
    cooldown_range: Optional[Any] = None
    discovery: Optional[Any] = None
    verbose: int = 1
    placement_group_timeout_s: float = 100
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def num_proc(self) -> int:
        """Horovod's ``num_proc`` of elastic settings: ``min_num_proc``."""
        return self.min_num_proc


class ElasticRayExecutor:
    """Horovod's ``ElasticRayExecutor``: an elastic job over the whole Ray cluster, discovered
    from its alive nodes (``CPU // cpus_per_slot`` slots each, with ``use_gpu`` also at most
    ``GPU // gpus_per_slot``). The same as ``RayExecutor(settings, min_workers=min_num_proc,
    max_workers=max_num_proc, ...)``; ``run(worker_fn)`` calls ``worker_fn()`` on every worker.

    Args:
        settings: from :meth:`create_settings`.
        use_gpu: reserve GPUs for the workers.
        cpus_per_slot: CPUs per worker.
        gpus_per_slot: GPUs per worker (needs ``use_gpu``; default 1 with it).
        env_vars: environment variables for the workers.
        override_discovery: discover the Ray cluster's nodes (True), or use
            ``settings.discovery``.

    Example::

        settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=4)
        executor = ElasticRayExecutor(settings, cpus_per_slot=1)
        executor.start()
        executor.run(train_fn)
        executor.shutdown()
    """

    @staticmethod
    def create_settings(
        min_num_proc: int = 1,
        max_num_proc: Optional[int] = None,
        reset_limit: Optional[int] = None,
        elastic_timeout: float = 600,
        timeout_s: float = 30,
        ssh_identity_file: Optional[str] = None,
        nics: Optional[Any] = None,
        min_np: Optional[int] = None,
        max_np: Optional[int] = None,
        **kwargs: Any,
    ) -> ElasticRaySettings:
        """Horovod's ``ElasticRayExecutor.create_settings`` (``min_np``/``max_np`` are its
        deprecated spellings). Other keywords: Horovod's settings (``verbose``,
        ``cooldown_range``, ``discovery``, ...); an unknown one raises
        :class:`~kolo.exceptions.InvalidArgumentError`.

        Example::

            settings = ElasticRayExecutor.create_settings(min_num_proc=2, elastic_timeout=60)
        """
        if min_np is not None:
            min_num_proc = min_np
            warnings.warn(
                "min_np is deprecated, use min_num_proc instead", DeprecationWarning, stacklevel=2
            )
        if max_np is not None:
            max_num_proc = max_np
            warnings.warn(
                "max_np is deprecated, use max_num_proc instead", DeprecationWarning, stacklevel=2
            )
        unknown = sorted(set(kwargs) - _SETTINGS_KWARGS)
        if unknown:
            raise InvalidArgumentError(
                f"ElasticRayExecutor.create_settings got unknown argument(s) {unknown}; it "
                f"accepts Horovod's settings: {sorted(_SETTINGS_KWARGS)}"
            )
        if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or timeout_s <= 0:
            raise InvalidValueError(
                f"timeout_s must be a positive number of seconds: Got {timeout_s!r}."
            )
        own = ("cooldown_range", "discovery", "verbose", "placement_group_timeout_s")
        known = {name: kwargs.pop(name) for name in own if name in kwargs}
        return ElasticRaySettings(
            min_num_proc=min_num_proc,
            max_num_proc=max_num_proc,
            reset_limit=reset_limit,
            elastic_timeout=elastic_timeout,
            timeout_s=float(timeout_s),
            ssh_identity_file=ssh_identity_file,
            nics=nics,
            extra=kwargs,
            **known,
        )

    def __init__(
        self,
        settings: ElasticRaySettings,
        use_gpu: bool = False,
        cpus_per_slot: float = 1,
        gpus_per_slot: Optional[float] = None,
        env_vars: Optional[dict] = None,
        override_discovery: bool = True,
    ) -> None:
        from kolo.ray.executor import RayExecutor, RaySettings

        if gpus_per_slot and not use_gpu:
            raise InvalidValueError(
                "gpus_per_slot is set, but use_gpu is False. use_gpu must be True if "
                "gpus_per_slot is set. "
            )
        self.settings = settings
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = gpus_per_slot or int(use_gpu)
        self.env_vars = dict(env_vars or {})
        self._executor = RayExecutor(
            RaySettings(
                timeout_s=settings.timeout_s,
                placement_group_timeout_s=settings.placement_group_timeout_s,
                nics=settings.nics,
                ssh_identity_file=settings.ssh_identity_file,
                discovery=settings.discovery,
            ),
            cpus_per_worker=cpus_per_slot,
            use_gpu=use_gpu,
            gpus_per_worker=gpus_per_slot,
            min_workers=settings.min_num_proc,
            max_workers=settings.max_num_proc,
            reset_limit=settings.reset_limit,
            cooldown_range=settings.cooldown_range,
            elastic_timeout=settings.elastic_timeout,
            override_discovery=override_discovery,
        )

    def start(self) -> None:
        """Waits until the cluster has ``min_num_proc`` slots (at most ``elastic_timeout``).

        Example::

            executor.start()
        """
        self._executor.start(extra_env_vars=self.env_vars)

    def run(
        self, worker_fn: Callable[[], Any], callbacks: Optional[List[Callable[[Any], Any]]] = None
    ) -> List[Any]:
        """Runs ``worker_fn()`` on every worker of the elastic job; returns the values of the
        workers of its last round, by rank. ``callbacks`` get every value the workers log with
        :func:`kolo.ray.worker.log`.

        Example::

            executor.run(train_fn, callbacks=[print])
        """
        return self._executor.run(worker_fn, callbacks=callbacks)

    def shutdown(self) -> None:
        """Stops what a run left (idempotent).

        Example::

            executor.shutdown()
        """
        self._executor.shutdown()
