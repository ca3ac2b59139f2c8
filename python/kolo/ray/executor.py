"""``kolo.ray.RayExecutor``: Horovod's Ray executor on kolo's runtime (see ``docs/ray.md``)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import uuid
from typing import Any, Callable, Iterator, Optional

from kolo._nics import nics_ip
from kolo.exceptions import (
    LaunchError,
    PlacementGroupTimeoutError,
    RankFailedError,
    TimeoutError,
)

__all__ = ["RayExecutor", "RaySettings"]

logger = logging.getLogger("kolo.ray")

#: How often the driver checks the job for failures while it waits on the actors.
_POLL_S = 0.1
#: After a rank raised, how long to wait for its own report (with its traceback).
_REPORT_WAIT_S = 2.0
#: How long shutdown waits for the killed actors to be gone.
_KILL_WAIT_S = 15.0


@dataclasses.dataclass
class RaySettings:
    """What :meth:`RayExecutor.create_settings` returns.

    ``timeout_s``: seconds the actors have to start and register; ``placement_group_timeout_s``:
    seconds to wait for the placement group; ``nics``: interface name(s) the job driver
    service listens on (default: this Ray node's IP). ``ssh_identity_file`` and ``ssh_str`` are
    accepted for Horovod compatibility and unused (Ray starts the processes). ``discovery``:
    for an elastic executor with ``override_discovery=False``, the object whose
    ``find_available_hosts_and_slots()`` names the hosts (as Horovod's ``settings.discovery``).

    Example::

        settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=30)
    """

    timeout_s: float = 30.0
    placement_group_timeout_s: float = 100.0
    nics: Optional[Any] = None
    ssh_identity_file: Optional[str] = None
    ssh_str: Optional[str] = None
    discovery: Optional[Any] = None


@dataclasses.dataclass
class _Rank:
    actor: Any
    task_index: int
    rank: int
    node_id: str
    node_ip: str
    pid: int
    host_label: str
    local_rank: int
    cross_rank: int


class RayExecutor:
    """Runs functions and stateful executables on kolo ranks placed as Ray actors (Horovod's
    ``horovod.ray.RayExecutor``), a fixed number of them or, given ``min_workers``, elastically.

    Give exactly one of ``num_workers`` (that many actors, PACK placement group: one bundle per
    worker) or ``num_hosts`` (that many nodes with ``num_workers_per_host`` actors each,
    STRICT_SPREAD: one bundle per node). Either way a node's ranks are consecutive (the Ray node
    id is the host identity), ``local_rank`` is the position on the node and ``cross_rank``
    the node's ordinal. With ``use_gpu`` each actor reserves ``gpus_per_worker`` GPUs (default
    1) and sees the union of its node's assigned GPUs in ``CUDA_VISIBLE_DEVICES``, ordered so
    ``local_rank`` indexes its own. With ``use_current_placement_group`` (default) an executor
    created inside a placement group uses that group instead of creating one.

    Invalid arguments raise :class:`kolo.exceptions.InvalidValueError` (a ``ValueError``, as
    Horovod raises).

    **Elastic mode** (``min_workers`` given, not ``num_workers``/``num_hosts``): every
    ``run``/``execute`` starts one worker actor per slot the discovery reports (by default the
    Ray cluster's alive nodes: ``CPU // cpus_per_worker`` slots each, see
    :class:`~kolo.ray.RayHostDiscovery`), at least ``min_workers`` and at most
    ``max_workers``; workers join as nodes are added and leave when they die, raise or lose
    their node, while the others continue from their last ``state.commit()`` (the function
    must use ``hvd.elastic.run``). A failing node is blacklisted (for ``cooldown_range``
    seconds, growing with each failure; without it, for the rest of the run). Fewer than
    ``min_workers`` for ``elastic_timeout`` seconds raises
    :class:`~kolo.exceptions.TimeoutError`; more than ``reset_limit`` resets raises
    :class:`~kolo.exceptions.ResetLimitExceededError`. The first worker to return ends the run;
    it returns the values of the workers of the last round by rank. See docs/elastic.md.

    Example::

        import ray
        from kolo.ray import RayExecutor

        ray.init()
        executor = RayExecutor(RayExecutor.create_settings(), num_workers=2)
        executor.start()

        def fn(scale):
            import kolo.torch as hvd
            import torch
            hvd.init()
            return hvd.allreduce(torch.tensor([scale * hvd.rank()]), op=hvd.Sum).item()

        assert executor.run(fn, args=[2.0]) == [2.0, 2.0]
        executor.shutdown()

    Elastic::

        executor = RayExecutor(settings, min_workers=2, max_workers=4)
        executor.start()

        def train():
            import kolo.torch as hvd
            hvd.init()
            state = hvd.elastic.TorchState(model, optimizer, epoch=0)

            @hvd.elastic.run
            def loop(state):
                for state.epoch in range(state.epoch, 10):
                    ...
                    state.commit()
                return hvd.rank()

            return loop(state)

        executor.run(train)          # e.g. [0, 1, 2] when three nodes had slots at the end
        executor.shutdown()
    """

    @staticmethod
    def create_settings(
        timeout_s: float = 30,
        ssh_identity_file: Optional[str] = None,
        ssh_str: Optional[str] = None,
        placement_group_timeout_s: float = 100,
        nics: Optional[Any] = None,
    ) -> RaySettings:
        """Horovod's ``RayExecutor.create_settings``.

        Example::

            settings = RayExecutor.create_settings(timeout_s=30, nics=["eth0"])
        """
        from kolo.exceptions import InvalidValueError

        for name, value in (
            ("timeout_s", timeout_s),
            ("placement_group_timeout_s", placement_group_timeout_s),
        ):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise InvalidValueError(
                    f"{name} must be a positive number of seconds: Got {value!r}."
                )
        return RaySettings(
            timeout_s=float(timeout_s),
            placement_group_timeout_s=float(placement_group_timeout_s),
            nics=nics,
            ssh_identity_file=ssh_identity_file,
            ssh_str=ssh_str,
        )

    def __init__(
        self,
        settings: Optional[RaySettings] = None,
        num_workers: Optional[int] = None,
        num_hosts: Optional[int] = None,
        num_workers_per_host: int = 1,
        cpus_per_worker: float = 1,
        use_gpu: bool = False,
        gpus_per_worker: Optional[float] = None,
        use_current_placement_group: bool = True,
        min_workers: Optional[int] = None,
        max_workers: Optional[int] = None,
        reset_limit: Optional[int] = None,
        cooldown_range: Optional[Any] = None,
        elastic_timeout: float = 600,
        override_discovery: bool = True,
    ) -> None:
        from kolo import _native
        from kolo.exceptions import InvalidValueError
        from kolo.ray._elastic_job import ElasticParams

        # Horovod's checks, in its order.
        if max_workers and (not min_workers or min_workers <= 0):
            raise InvalidValueError(
                "`max_workers` provided without any positive `min_workers`. Elastic workloads "
                "require a positive `min_workers`."
            )
        if min_workers and (num_workers or num_hosts):
            raise InvalidValueError(
                "Both `min_workers` and `num_workers` (or `num_hosts`) provided. Only one of the "
                "above is allowed as workloads cannot be elastic and non-elastic."
            )
        self.settings = settings or RayExecutor.create_settings()
        self.use_current_placement_group = use_current_placement_group
        self._ranks: list[_Rank] = []
        self._driver: Any = None
        self._placement_group: Any = None
        self._owns_placement_group = False
        #: Seconds ``start()`` took, from its call to every rank registered.
        self.start_seconds: Optional[float] = None
        #: Elastic mode: the checked parameters (None for a fixed-size executor).
        self.elastic: Optional[ElasticParams] = None
        self._elastic_started: Optional[dict] = None
        self._elastic_job: Any = None
        #: Elastic mode: the sizes of the last run's rounds, in order (e.g. ``[2, 4, 3]``).
        self.elastic_round_sizes: list[int] = []
        if min_workers is not None:
            self.elastic = ElasticParams.check(
                min_workers,
                max_workers,
                reset_limit,
                cooldown_range,
                elastic_timeout,
                override_discovery,
                cpus_per_worker,
                use_gpu,
                gpus_per_worker,
            )
            if (
                not self.elastic.override_discovery
                and getattr(self.settings, "discovery", None) is None
            ):
                raise InvalidValueError(
                    "override_discovery=False needs a discovery of your own in "
                    "settings.discovery (an object with find_available_hosts_and_slots()); "
                    "or leave override_discovery=True to discover the Ray cluster's nodes."
                )
            self.num_workers = min_workers
            self.use_gpu = self.elastic.use_gpu
            return

        for name, value in (
            ("num_workers", num_workers),
            ("num_hosts", num_hosts),
            ("num_workers_per_host", num_workers_per_host),
        ):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise InvalidValueError(f"`{name}` must be an int: Got {value!r}.")
        if value_negative := [
            name
            for name, value in (("num_workers", num_workers), ("num_hosts", num_hosts))
            if value is not None and value < 0
        ]:
            raise InvalidValueError(f"`{value_negative[0]}` must be at least 1.")
        self._plan = _native.ray_plan(
            num_workers,
            num_hosts,
            num_workers_per_host,
            float(cpus_per_worker),
            bool(use_gpu),
            None if gpus_per_worker is None else float(gpus_per_worker),
        )
        self.num_workers = len(self._plan["worker_bundles"])
        self.use_gpu = bool(use_gpu)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(
        self,
        executable_cls: Optional[type] = None,
        executable_args: Optional[list] = None,
        executable_kwargs: Optional[dict] = None,
        extra_env_vars: Optional[dict] = None,
    ) -> None:
        """Places the actors, registers them as ranks of one kolo job, and builds
        ``executable_cls(*executable_args, **executable_kwargs)`` in each (after the rank
        variables are set, so ``hvd.init()`` in its constructor works). ``extra_env_vars`` go
        into every actor's environment first. Raises
        :class:`~kolo.exceptions.PlacementGroupTimeoutError` when the placement group is not
        ready in ``placement_group_timeout_s``, :class:`~kolo.exceptions.TimeoutError` when the
        actors do not start in ``timeout_s``, and :class:`~kolo.exceptions.RankFailedError`
        when an executable's constructor raises.

        Example::

            class MyModel:
                def __init__(self, learning_rate):
                    self.learning_rate = learning_rate

            executor.start(executable_cls=MyModel, executable_kwargs={"learning_rate": 0.1})
        """
        import ray

        if self._ranks or self._elastic_started is not None:
            raise LaunchError("this RayExecutor is already started; call shutdown() first")
        if not ray.is_initialized():
            ray.init()
        began = time.monotonic()
        if self.elastic is not None:
            self._start_elastic(executable_cls, executable_args, executable_kwargs, extra_env_vars)
            self.start_seconds = time.monotonic() - began
            return
        try:
            self._start(
                executable_cls,
                tuple(executable_args or ()),
                dict(executable_kwargs or {}),
                {str(k): str(v) for k, v in (extra_env_vars or {}).items()},
            )
        except BaseException:
            self._teardown("start() failed")
            raise
        self.start_seconds = time.monotonic() - began
        logger.info(
            "RayExecutor: %d ranks on %d node(s) ready in %.2f s",
            len(self._ranks),
            len({r.node_id for r in self._ranks}),
            self.start_seconds,
        )

    def _start_elastic(
        self,
        executable_cls: Optional[type],
        executable_args: Optional[list],
        executable_kwargs: Optional[dict],
        extra_env_vars: Optional[dict],
    ) -> None:
        """Elastic ``start()`` (Horovod's ``ElasticAdapter.start``): waits until the discovery
        reports ``min_workers`` slots (at most ``elastic_timeout``) and keeps the executable and
        environment for the workers each ``run``/``execute`` starts."""
        from kolo.ray._elastic_job import wait_for_slots
        from kolo.ray._hosts import HostManager, RayHostDiscovery

        params = self.elastic
        assert params is not None
        discovery = (
            RayHostDiscovery(params.use_gpu, params.cpus_per_worker, params.gpus_per_worker or 1)
            if params.override_discovery
            else self.settings.discovery
        )
        hosts = HostManager(discovery, params.cooldown_range)
        wait_for_slots(hosts, params)
        self._elastic_started = {
            "hosts": hosts,
            "executable": None
            if executable_cls is None
            else (executable_cls, tuple(executable_args or ()), dict(executable_kwargs or {})),
            "env": {str(k): str(v) for k, v in (extra_env_vars or {}).items()},
        }
        logger.info(
            "RayExecutor (elastic): %d slot(s) available (min_workers=%d, max_workers=%s)",
            hosts.slot_count(),
            params.min_workers,
            params.max_workers,
        )

    def _run_elastic(
        self,
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        callbacks: Optional[list[Callable[[Any], Any]]],
        with_executable: bool,
    ) -> list[Any]:
        from kolo.ray._elastic_job import ElasticJob

        started = self._elastic_started
        if started is None:
            raise LaunchError("this RayExecutor is not started (call start())")
        if self._elastic_job is not None:
            raise LaunchError("an elastic run of this RayExecutor is already in progress")
        assert self.elastic is not None
        job = ElasticJob(
            self.elastic,
            self.settings,
            started["hosts"],
            self._bind_ip(),
            started["env"],
            started["executable"],
        )
        self._elastic_job = job
        try:
            return job.run(fn, args, kwargs, callbacks, with_executable)
        finally:
            self._elastic_job = None
            self.elastic_round_sizes = list(job.round_sizes)

    def _start(
        self,
        executable_cls: Optional[type],
        executable_args: tuple,
        executable_kwargs: dict,
        extra_env_vars: dict,
    ) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from kolo import _native
        from kolo.ray._worker import start_rank_actor

        settings = self.settings
        self._acquire_placement_group()
        bundle_of = self._plan["worker_bundles"]
        if not self._owns_placement_group and len(self._placement_group.bundle_specs) < len(
            self._plan["bundles"]
        ):
            bundle_of = [-1] * self.num_workers
        actors = [
            start_rank_actor(
                num_cpus=self._plan["cpus_per_worker"],
                num_gpus=self._plan["gpus_per_worker"],
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._placement_group,
                    placement_group_bundle_index=bundle,
                    placement_group_capture_child_tasks=True,
                ),
                world_rank=index,
                world_size=len(bundle_of),
            )
            for index, bundle in enumerate(bundle_of)
        ]
        # Known at once so that teardown can kill them whatever happens next.
        self._ranks = [
            _Rank(actor, index, index, "", "", 0, "", 0, 0) for index, actor in enumerate(actors)
        ]
        try:
            locations = ray.get(
                [actor.location.remote() for actor in actors], timeout=settings.timeout_s
            )
        except ray.exceptions.GetTimeoutError as error:
            raise TimeoutError(
                f"RayExecutor: the {len(actors)} worker actors did not start within "
                f"timeout_s={settings.timeout_s:g} s"
            ) from error
        node_ips = _node_ips()
        for loc in locations:
            loc["node_ip"] = node_ips.get(loc["node_id"], loc["node_ip"])
        layout = _native.ray_layout([(loc["node_id"], loc["gpu_ids"]) for loc in locations])
        self._driver = _native.LaunchDriver(
            len(actors),
            f"{self._bind_ip()}:0",
            settings.timeout_s,
            max(30.0, settings.timeout_s),
        )
        ranks = []
        setups = []
        for actor, loc, lay in zip(actors, locations, layout):
            label = f"ray-node-{loc['node_id'][:12]}"
            env = dict(extra_env_vars)
            env.update(self._driver.worker_env(lay["task_index"]))
            env["KOLO_HOSTNAME"] = label
            env["KOLO_RAY_NODE_ID"] = loc["node_id"]
            if lay["cuda_visible_devices"] is not None:
                env["CUDA_VISIBLE_DEVICES"] = lay["cuda_visible_devices"]
            ranks.append(
                _Rank(
                    actor,
                    lay["task_index"],
                    lay["task_index"],
                    loc["node_id"],
                    loc["node_ip"],
                    loc["pid"],
                    label,
                    lay["local_rank"],
                    0,
                )
            )
            setups.append(
                actor.setup.remote(env, label, executable_cls, executable_args, executable_kwargs)
            )
        self._ranks = sorted(ranks, key=lambda r: r.task_index)
        by_task = {r.task_index: position for position, r in enumerate(self._ranks)}
        order = [by_task[lay["task_index"]] for lay in layout]
        results: list[Any] = [None] * len(setups)
        for position, value in zip(order, self._gather(setups, [r.task_index for r in ranks])):
            results[position] = value
        assignment = self._driver.assignment() or []
        rank_of = {row["task_index"]: row for row in assignment}
        for entry in self._ranks:
            row = rank_of.get(entry.task_index)
            if row is not None:
                entry.rank = int(row["rank"])
                entry.local_rank = int(row["local_rank"])
                entry.cross_rank = int(row["cross_rank"])
        self._ranks.sort(key=lambda r: r.rank)

    def _acquire_placement_group(self) -> None:
        import ray
        from ray.util.placement_group import (
            get_current_placement_group,
            placement_group,
            remove_placement_group,
        )

        current = get_current_placement_group() if self.use_current_placement_group else None
        if current is not None:
            self._placement_group, self._owns_placement_group = current, False
            return
        bundles = self._plan["bundles"]
        group = placement_group(
            bundles, strategy=self._plan["strategy"], name=f"kolo-ray-{uuid.uuid4().hex[:12]}"
        )
        self._placement_group, self._owns_placement_group = group, True
        timeout = self.settings.placement_group_timeout_s
        try:
            ray.get(group.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            available = {k: float(v) for k, v in ray.available_resources().items()}
            total = {k: float(v) for k, v in ray.cluster_resources().items()}
            nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
            remove_placement_group(group)
            self._placement_group, self._owns_placement_group = None, False
            shown = {k: v for k, v in available.items() if k in ("CPU", "GPU", "memory")}
            raise PlacementGroupTimeoutError(
                f"RayExecutor: the placement group was not ready after "
                f"placement_group_timeout_s={timeout:g} s: asked for {self._plan['description']}; "
                f"available now {shown or available} of {_cpu_gpu(total)} on {nodes} alive "
                "node(s). Lower num_workers/num_hosts/cpus_per_worker/gpus_per_worker, add "
                "nodes, or raise placement_group_timeout_s.",
                requested=[dict(bundle) for bundle in bundles],
                available=available,
                timeout_s=timeout,
            ) from None

    def _bind_ip(self) -> str:
        import ray

        ip = nics_ip(self.settings.nics)
        if ip is not None:
            return ip
        here = ray.get_runtime_context().get_node_id()
        return _node_ips().get(here) or ray.util.get_node_ip_address()

    def shutdown(self) -> None:
        """Stops every actor and removes the placement group the executor created
        (idempotent); ``start()`` may follow.

        Example::

            executor.shutdown()
        """
        job = self._elastic_job
        if job is not None:
            # The run's own thread stops its actors and job driver; wait for it (bounded).
            job.abort()
            deadline = time.monotonic() + _KILL_WAIT_S + 5.0
            while self._elastic_job is job and time.monotonic() < deadline:
                time.sleep(_POLL_S)
        self._elastic_started = None
        self._teardown(None)

    def _teardown(self, reason: Optional[str]) -> None:
        import ray

        driver, self._driver = self._driver, None
        ranks, self._ranks = self._ranks, []
        if driver is not None and reason is not None:
            driver.abort(f"RayExecutor: {reason}")
        if ranks and ray.is_initialized():
            for entry in ranks:
                try:
                    ray.kill(entry.actor, no_restart=True)
                except Exception as error:  # already gone
                    logger.debug("ray.kill: %s", error)
            pings = [entry.actor.ping.remote() for entry in ranks]
            deadline = time.monotonic() + _KILL_WAIT_S
            while pings and time.monotonic() < deadline:
                ready, pings = ray.wait(pings, num_returns=len(pings), timeout=_POLL_S)
                alive = []
                for ref in ready:
                    try:
                        ray.get(ref)
                        alive.append(ref)
                    except Exception:
                        pass
                if alive:
                    logger.debug("%d actor(s) still answered after ray.kill", len(alive))
            if pings:
                logger.warning("RayExecutor: %d actor(s) still alive after shutdown", len(pings))
        if driver is not None:
            driver.shutdown()
        group, self._placement_group = self._placement_group, None
        if group is not None and self._owns_placement_group and ray.is_initialized():
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(group)
            except Exception as error:
                logger.warning("RayExecutor: could not remove the placement group: %s", error)
        self._owns_placement_group = False

    # -- calls -------------------------------------------------------------------------------

    def run(
        self,
        fn: Callable[..., Any],
        args: Optional[list] = None,
        kwargs: Optional[dict] = None,
        callbacks: Optional[list[Callable[[Any], Any]]] = None,
    ) -> list[Any]:
        """Runs ``fn(*args, **kwargs)`` on every rank; returns the results by rank. A rank
        that raises or dies raises :class:`~kolo.exceptions.RankFailedError` here (rank, node,
        remote traceback) and the other actors are stopped.

        ``callbacks`` (Horovod's): each callable is called on the driver with every value a
        worker logs with :func:`kolo.ray.worker.log` during this call, in the order logged
        (Horovod's ``ray_logger.log``; it reaches the callbacks through a Ray queue given to
        every worker with ``set_queue``). A callback that raises stops the job as a failed
        rank does.

        Example::

            def fn(x):
                import kolo.torch as hvd
                from kolo.ray.worker import log
                hvd.init()
                log({"rank": hvd.rank(), "loss": 0.5})
                return x + hvd.rank()

            executor.run(fn, args=[10], callbacks=[print])  # [10, 11]

        Elastic mode: ``fn`` runs on every worker of the elastic job (see the class); the
        return values of the workers of the last round, by rank.
        """
        args_t = tuple(args or ())
        kwargs_d = dict(kwargs or {})
        if self.elastic is not None:
            return self._run_elastic(fn, args_t, kwargs_d, callbacks, with_executable=False)
        self._check_started()
        with self._logged_values(callbacks) as on_poll:
            refs = [entry.actor.run.remote(fn, args_t, kwargs_d) for entry in self._ranks]
            return self._gather(refs, [r.task_index for r in self._ranks], on_poll)

    def run_remote(
        self, fn: Callable[..., Any], args: Optional[list] = None, kwargs: Optional[dict] = None
    ) -> list[Any]:
        """Like :meth:`run`, without waiting: returns one Ray object ref per rank, by rank
        (``ray.get`` them; no fail-fast on this path).

        Example::

            refs = executor.run_remote(fn, args=[10])
            ray.get(refs)
        """
        if self.elastic is not None:
            from kolo.exceptions import NotSupportedError

            raise NotSupportedError(
                "run_remote is not available in elastic mode (min_workers): the workers are "
                "ephemeral, so there are no object refs to return; use run() (as Horovod)"
            )
        self._check_started()
        args_t = tuple(args or ())
        kwargs_d = dict(kwargs or {})
        return [entry.actor.run.remote(fn, args_t, kwargs_d) for entry in self._ranks]

    def execute(
        self,
        fn: Callable[[Any], Any],
        callbacks: Optional[list[Callable[[Any], Any]]] = None,
    ) -> list[Any]:
        """Runs ``fn(executable)`` on every rank (the object ``start(executable_cls=...)``
        built, kept across calls); returns the results by rank, with fail-fast and
        ``callbacks`` as :meth:`run`.

        Example::

            executor.execute(lambda model: model.train(), callbacks=[print])

        Elastic mode: every worker builds the executable of ``start()`` when it starts, then
        runs ``fn(executable)`` as :meth:`run` runs a function.
        """
        if self.elastic is not None:
            return self._run_elastic(fn, (), {}, callbacks, with_executable=True)
        self._check_started()
        with self._logged_values(callbacks) as on_poll:
            refs = [entry.actor.execute.remote(fn) for entry in self._ranks]
            return self._gather(refs, [r.task_index for r in self._ranks], on_poll)

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """Runs ``fn(executable)`` on rank 0 only; returns its result.

        Example::

            executor.execute_single(lambda model: model.state_dict())
        """
        if self.elastic is not None:
            from kolo.exceptions import NotSupportedError

            raise NotSupportedError(
                "execute_single is not available in elastic mode (min_workers); use execute() "
                "(as Horovod)"
            )
        self._check_started()
        entry = self._ranks[0]
        return self._gather([entry.actor.execute.remote(fn)], [entry.task_index])[0]

    @property
    def workers(self) -> list[Any]:
        """The actor handles, by rank (Horovod's ``executor.workers``); in elastic mode the
        workers of the run in progress (none between runs), by task index."""
        job = self._elastic_job
        if job is not None:
            return [job.workers[task].actor for task in sorted(job.workers)]
        return [entry.actor for entry in self._ranks]

    def worker_info(self) -> list[dict[str, Any]]:
        """Per rank: ``rank``, ``local_rank``, ``cross_rank``, ``node_id``, ``node_ip``,
        ``pid`` and ``hostname`` (the host identity kolo uses: ``ray-node-<node id>``).

        Example::

            for info in executor.worker_info():
                print(info["rank"], info["node_ip"], info["pid"])
        """
        return [
            {
                "rank": r.rank,
                "local_rank": r.local_rank,
                "cross_rank": r.cross_rank,
                "node_id": r.node_id,
                "node_ip": r.node_ip,
                "pid": r.pid,
                "hostname": r.host_label,
            }
            for r in self._ranks
        ]

    @contextlib.contextmanager
    def _logged_values(
        self, callbacks: Optional[list[Callable[[Any], Any]]]
    ) -> Iterator[Optional[Callable[[], None]]]:
        """While the block runs, the workers' :func:`kolo.ray.worker.log` values go to a Ray
        queue; yields the function that hands the queued values to ``callbacks`` (None
        without callbacks). Values still queued when the block ends are handed over, then the
        workers' queue is unset and the queue's actor removed."""
        if not callbacks:
            yield None
            return
        import ray
        from ray.util.queue import Queue

        # A zero-CPU actor: the placement group may hold every CPU of the cluster.
        queue = Queue(actor_options={"num_cpus": 0})
        ray.get([entry.actor.set_queue.remote(queue) for entry in self._ranks])

        def deliver() -> None:
            while not queue.empty():
                value = queue.get_nowait()
                for callback in callbacks:
                    callback(value)

        try:
            yield deliver
            deliver()
        finally:
            if self._driver is not None:
                ray.get([entry.actor.set_queue.remote(None) for entry in self._ranks])
            queue.shutdown()

    def _check_started(self) -> None:
        if not self._ranks or self._driver is None:
            raise LaunchError(
                "this RayExecutor is not started (call start(); after a failure or shutdown() "
                "start() again)"
            )

    # -- waiting with fail-fast --------------------------------------------------------------

    def _gather(
        self,
        refs: list[Any],
        task_indices: list[int],
        on_poll: Optional[Callable[[], None]] = None,
    ) -> list[Any]:
        import ray

        results: list[Any] = [None] * len(refs)
        pending = {ref: position for position, ref in enumerate(refs)}
        while pending:
            cause = self._driver.failure() if self._driver is not None else None
            if cause is not None:
                self._fail(cause)
            if on_poll is not None:
                try:
                    on_poll()
                except BaseException:
                    self._teardown("a callback raised")
                    raise
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_POLL_S)
            for ref in ready:
                position = pending.pop(ref)
                try:
                    results[position] = ray.get(ref)
                except ray.exceptions.RayActorError as error:
                    self._driver.report_task_failure(
                        task_indices[position], f"its Ray actor died: {error}"
                    )
                    self._fail(self._driver.failure())
                except ray.exceptions.RayTaskError as error:
                    deadline = time.monotonic() + _REPORT_WAIT_S
                    while self._driver.failure() is None and time.monotonic() < deadline:
                        time.sleep(0.02)
                    if self._driver.failure() is None:
                        self._driver.report_task_failure(task_indices[position], str(error))
                    self._fail(self._driver.failure())
        return results

    def _fail(self, cause: Any) -> None:
        rank, host, message = cause if cause is not None else (None, "", "unknown failure")
        entry = next((r for r in self._ranks if r.rank == rank), None)
        node = f"{host} (node {entry.node_id}, {entry.node_ip})" if entry else host
        first_line = message.strip().splitlines()[-1] if message.strip() else "failed"
        error = RankFailedError(
            f"RayExecutor: rank {rank} on {node} failed: {first_line}",
            rank=rank,
            host=node,
            task_index=entry.task_index if entry else None,
            task_attempt=0,
            remote_traceback=message,
        )
        self._teardown(f"rank {rank} failed")
        raise error


def _node_ips() -> dict[str, str]:
    """The IP each alive Ray node registered with (``ray.init(_node_ip_address=...)``)."""
    import ray

    return {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")}


def _cpu_gpu(resources: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in resources.items() if k in ("CPU", "GPU")}
