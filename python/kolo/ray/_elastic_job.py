"""The elastic mode of :class:`kolo.ray.RayExecutor` (internal): Horovod's elastic Ray adapter
(``horovod/ray/elastic_v2.py``) on kolo's job driver.

One :class:`ElasticJob` per ``run()``/``execute()``: the workers are ephemeral actors, one per
slot the discovery reports (up to ``max_workers``), each pinned to its Ray node. The kolo job
driver runs in elastic mode (``min_np``/``max_np``/``elastic_timeout``/``reset_limit``):

- a new slot (a node joined, a blacklisted node's cooldown ended) gets an actor with a NEW task
  index; once its process is up the driver learns of it (``add_tasks``) and the running
  workers see a host update at their next ``state.commit()`` and reset into a larger round;
- an actor that dies, raises, does not start in ``timeout_s``, or whose node leaves the cluster
  is removed (``remove_task``): the survivors' collectives fail, they restore their last commit
  and continue in a smaller round; the worker's host is blacklisted (Horovod's
  ``cooldown_range``) unless its node is simply gone;
- the first worker to return ends the job: the others of its round return too (bounded by
  ``min(timeout_s, 10 s)``), then they leave the job together; the results are their return
  values by rank.

The discovery is polled about every second (Horovod's ``DISCOVER_HOSTS_FREQUENCY_SECS``).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
import types
from typing import Any, Callable, Optional

from kolo.exceptions import (
    InvalidValueError,
    LaunchError,
    RankFailedError,
    ResetLimitExceededError,
    TimeoutError,
)
from kolo.ray._hosts import HostManager, check_cooldown_range, plan_slots

logger = logging.getLogger("kolo.ray")

#: How often the driver loop looks at the actors and the job driver.
_POLL_S = 0.1
#: How often the discovery is asked for hosts (Horovod's ``DISCOVER_HOSTS_FREQUENCY_SECS``).
DISCOVERY_PERIOD_S = 1.0
#: A worker silent this long is removed by the job driver (its node may be gone without Ray
#: noticing yet).
_HEARTBEAT_TIMEOUT_S = 10.0
#: How long new workers whose processes are up wait for others starting with them, to join
#: the job together.
_JOIN_BATCH_S = 2.0
#: Once a worker returned, how long the others of its round have to return too (they run the
#: same loop, so normally they return within milliseconds).
_FINISH_GRACE_S = 10.0
#: How long the workers that returned have to leave the job (``hvd.shutdown()``) at the end.
_LEAVE_WAIT_S = 10.0
#: How long teardown waits for killed actors to be gone.
_KILL_WAIT_S = 15.0
#: ``max_np`` of the job driver when ``max_workers`` is None (unbounded, as in Horovod).
_UNBOUNDED = 1 << 20
#: What the job driver's aborts say (collective/src/control/driver_state.rs).
_RESET_LIMIT_ABORT = "exceeded its limit"
_ELASTIC_TIMEOUT_ABORT = "(--elastic-timeout)"


@dataclasses.dataclass(frozen=True)
class ElasticParams:
    """Horovod's ``ElasticParams``, checked: the arguments of an elastic ``RayExecutor``."""

    min_workers: int
    max_workers: Optional[int]
    reset_limit: Optional[int]
    cooldown_range: Optional[tuple[float, float]]
    elastic_timeout: float
    override_discovery: bool
    cpus_per_worker: float
    use_gpu: bool
    gpus_per_worker: float

    @staticmethod
    def check(
        min_workers: Any,
        max_workers: Any,
        reset_limit: Any,
        cooldown_range: Any,
        elastic_timeout: Any,
        override_discovery: Any,
        cpus_per_worker: Any,
        use_gpu: Any,
        gpus_per_worker: Any,
    ) -> ElasticParams:
        """The parameters, or :class:`~kolo.exceptions.InvalidValueError` naming the bad one."""

        def whole(name: str, value: Any, least: int) -> None:
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise InvalidValueError(f"`{name}` must be an int >= {least}: Got {value!r}.")

        whole("min_workers", min_workers, 1)
        if max_workers is not None:
            whole("max_workers", max_workers, 1)
            if max_workers < min_workers:
                raise InvalidValueError(
                    f"`max_workers` ({max_workers}) must be at least `min_workers` ({min_workers})."
                )
            if max_workers > _UNBOUNDED:
                raise InvalidValueError(f"`max_workers` must be at most {_UNBOUNDED}.")
        if reset_limit is not None:
            whole("reset_limit", reset_limit, 0)
        for name, value in (
            ("elastic_timeout", elastic_timeout),
            ("cpus_per_worker", cpus_per_worker),
        ):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise InvalidValueError(f"`{name}` must be a positive number: Got {value!r}.")
        if elastic_timeout >= 1e9:
            raise InvalidValueError(
                f"`elastic_timeout` must be below 1e9 seconds: Got {elastic_timeout!r}."
            )
        if gpus_per_worker and not use_gpu:
            raise InvalidValueError(
                "gpus_per_worker is set, but use_gpu is False. use_gpu must be True if "
                "gpus_per_worker is set."
            )
        if use_gpu and gpus_per_worker is not None and not gpus_per_worker >= 1:
            raise InvalidValueError(f"gpus_per_worker must be >= 1: Got {gpus_per_worker}.")
        return ElasticParams(
            min_workers=min_workers,
            max_workers=max_workers,
            reset_limit=reset_limit,
            cooldown_range=check_cooldown_range(cooldown_range),
            elastic_timeout=float(elastic_timeout),
            override_discovery=bool(override_discovery),
            cpus_per_worker=float(cpus_per_worker),
            use_gpu=bool(use_gpu),
            gpus_per_worker=float(gpus_per_worker or int(bool(use_gpu))),
        )

    def slot_description(self) -> str:
        gpus = f" and {self.gpus_per_worker:g} GPU(s)" if self.use_gpu else ""
        return f"{self.cpus_per_worker:g} CPU(s){gpus}"


def wait_for_slots(hosts: HostManager, params: ElasticParams) -> None:
    """Polls the discovery until it reports ``min_workers`` slots, at most ``elastic_timeout``
    (Horovod's ``wait_for_available_slots``); raises :class:`~kolo.exceptions.TimeoutError`
    naming both numbers."""
    deadline = time.monotonic() + params.elastic_timeout
    while True:
        hosts.update()
        slots = hosts.slot_count()
        if slots >= params.min_workers:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"RayExecutor: only {slots} worker slot(s) on {len(hosts.available())} usable "
                f"node(s) were available for elastic_timeout={params.elastic_timeout:g} s, "
                f"fewer than min_workers={params.min_workers} (a slot is "
                f"{params.slot_description()} of a node). Add nodes, lower min_workers or "
                "cpus_per_worker, or raise elastic_timeout."
            )
        time.sleep(min(DISCOVERY_PERIOD_S, max(0.0, deadline - time.monotonic())))


@dataclasses.dataclass
class _Worker:
    task_index: int
    host: str
    node_id: str
    actor: Any
    boot_ref: Any
    boot_deadline: float
    member: bool
    run_ref: Any = None
    pid: int = 0
    done: bool = False
    #: Where its process came up (a new worker waits there for the others starting with it).
    location: Optional[dict] = None
    booted_at: float = 0.0


@dataclasses.dataclass
class _Failure:
    task_index: int
    host: str
    reason: str
    traceback: str


class ElasticJob:
    """One elastic run: the driver, the actors, discovery and the results (see the module)."""

    def __init__(
        self,
        params: ElasticParams,
        settings: Any,
        hosts: HostManager,
        bind_ip: str,
        extra_env_vars: dict[str, str],
        executable: Optional[tuple[type, tuple, dict]],
    ) -> None:
        self.params = params
        self.settings = settings
        self.hosts = hosts
        self.bind_ip = bind_ip
        self.extra_env_vars = extra_env_vars
        self.executable = executable
        self.workers: dict[int, _Worker] = {}
        #: The sizes of the rounds completed, in order (what the log shows).
        self.round_sizes: list[int] = []
        self._gone: list[Any] = []
        self._failures: list[_Failure] = []
        self._results: dict[int, Any] = {}
        self._next_task = 0
        self._driver: Any = None
        self._queue: Any = None
        self._round: tuple[int, ...] = ()
        self._below_min_since: Optional[float] = None
        self._last_assignment: list[dict] = []
        self._aborted = False
        self._queue_lost = False
        self._warm: tuple[str, ...] = ()

    # -- the run -----------------------------------------------------------------------------

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        callbacks: Optional[list[Callable[[Any], Any]]],
        with_executable: bool,
    ) -> list[Any]:
        """Runs ``fn`` on every worker until one returns; the return values by rank."""
        from kolo import _native

        params = self.params
        wait_for_slots(self.hosts, params)
        plan = plan_slots(self.hosts.available(), params.max_workers)
        initial = [host for host, count in plan.items() for _ in range(count)]
        self._driver = _native.LaunchDriver(
            len(initial),
            f"{self.bind_ip}:0",
            self.settings.timeout_s,
            _HEARTBEAT_TIMEOUT_S,
            min_np=params.min_workers,
            max_np=params.max_workers or _UNBOUNDED,
            elastic_timeout=params.elastic_timeout,
            reset_limit=params.reset_limit,
        )
        self._call = (fn, args, kwargs, with_executable)
        self._warm = _warm_modules(fn)
        failed = True
        try:
            if callbacks:
                import ray
                from ray.util.queue import Queue
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                # A zero-CPU actor (the workers may hold every CPU of the cluster) on this
                # driver's node, which outlives the nodes workers come and go with.
                here = ray.get_runtime_context().get_node_id()
                self._queue = Queue(
                    actor_options={
                        "num_cpus": 0,
                        "scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=False),
                    }
                )
            logger.info(
                "RayExecutor (elastic): starting %d worker(s) on %d node(s) (min_workers=%d, "
                "max_workers=%s)",
                len(initial),
                len(plan),
                params.min_workers,
                params.max_workers,
            )
            for host in initial:
                self._spawn(host, member=True)
            self._loop(callbacks)
            failed = False
        finally:
            self._teardown("the elastic run failed" if failed else None, callbacks)
        rank_of = {int(r["task_index"]): int(r["rank"]) for r in self._last_assignment}
        ordered = sorted(self._results, key=lambda task: (rank_of.get(task, 1 << 30), task))
        return [self._results[task] for task in ordered]

    def _loop(self, callbacks: Optional[list[Callable[[Any], Any]]]) -> None:
        import ray

        next_discovery = time.monotonic() + DISCOVERY_PERIOD_S
        finishing_since: Optional[float] = None
        while True:
            now = time.monotonic()
            if self._aborted:
                raise LaunchError("RayExecutor: shutdown() was called during the elastic run")
            cause = self._driver.failure()
            if cause is not None and finishing_since is None:
                raise self._job_error(cause)
            self._deliver(callbacks)
            self._note_round()
            if finishing_since is None:
                self._check_boots(now)
            running = {w.run_ref: w for w in self.workers.values() if w.run_ref and not w.done}
            if running:
                ready, _ = ray.wait(list(running), num_returns=len(running), timeout=_POLL_S)
            else:
                ready = []
                time.sleep(_POLL_S)
            for ref in ready:
                self._on_returned(running[ref], ref)
            if self._results and finishing_since is None:
                finishing_since = time.monotonic()
                logger.info("RayExecutor (elastic): a worker returned; the job ends")
                for worker in [w for w in self.workers.values() if w.run_ref is None]:
                    self._drop(worker, "the job ended before it started", failure=False)
            if finishing_since is not None:
                # Workers outside the round that finished (joining one it will not open) are
                # stopped at once; those in it return too.
                in_round = {int(row["task_index"]) for row in self._last_assignment}
                for worker in list(self.workers.values()):
                    if in_round and not worker.done and worker.task_index not in in_round:
                        self._drop(worker, "the job ended before it joined", failure=False)
                pending = [w for w in self.workers.values() if not w.done]
                if not pending:
                    return
                grace = min(self.settings.timeout_s, _FINISH_GRACE_S)
                if time.monotonic() - finishing_since > grace or cause is not None:
                    logger.warning(
                        "RayExecutor (elastic): %d worker(s) did not return with the first "
                        "(within %g s); stopping them (their results are left out)",
                        len(pending),
                        grace,
                    )
                    return
                continue
            self._check_driver_removals()
            if time.monotonic() >= next_discovery:
                next_discovery = time.monotonic() + DISCOVERY_PERIOD_S
                self._rediscover()
            if not self.workers:
                raise self._all_lost()
            self._check_min_workers()

    # -- workers -----------------------------------------------------------------------------

    def _spawn(self, host: str, member: bool) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from kolo.ray._worker import start_rank_actor

        task = self._next_task
        self._next_task += 1
        node_id = _node_of(host)
        if node_id is None:
            reason = f"host {host!r} is not an alive Ray node (by node id or IP)"
            logger.warning("RayExecutor: %s; blacklisting it", reason)
            self.hosts.blacklist(host)
            if member:  # a task of the first round: it will not register
                self._driver.remove_task(task, reason)
            return
        actor = start_rank_actor(
            num_cpus=self.params.cpus_per_worker,
            num_gpus=self.params.gpus_per_worker if self.params.use_gpu else 0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            world_rank=task,
            world_size=max(1, len(self.workers) + 1),
        )
        self.workers[task] = _Worker(
            task_index=task,
            host=host,
            node_id=node_id,
            actor=actor,
            boot_ref=actor.location.remote(self._warm),
            boot_deadline=time.monotonic() + self.settings.timeout_s,
            member=member,
        )
        logger.info("RayExecutor (elastic): starting worker %d on node %s", task, node_id[:12])

    def _check_boots(self, now: float) -> None:
        """Starts the function on workers whose process came up. New workers join the job
        together: those starting at the same time are added in one ``add_tasks`` (one reset
        of the running workers, not one each), waiting at most ``_JOIN_BATCH_S`` for a slow
        one."""
        import ray

        booting = {
            w.boot_ref: w for w in self.workers.values() if w.run_ref is None and not w.location
        }
        if booting:
            ready, _ = ray.wait(list(booting), num_returns=len(booting), timeout=0)
            for ref in ready:
                worker = booting.pop(ref)
                try:
                    location = ray.get(ref)
                except Exception as error:
                    self._drop(worker, f"its Ray actor did not start: {error}")
                    continue
                worker.location, worker.booted_at = location, now
                if worker.member:
                    self._start_run(worker)
            for worker in booting.values():
                if now > worker.boot_deadline:
                    self._drop(
                        worker,
                        f"its Ray actor did not start within timeout_s="
                        f"{self.settings.timeout_s:g} s (a worker needs "
                        f"{self.params.slot_description()} free on its node)",
                    )
        joining = [w for w in self.workers.values() if w.run_ref is None and w.location]
        if not joining:
            return
        still_booting = any(not w.member and not w.location for w in self.workers.values())
        if still_booting and now - min(w.booted_at for w in joining) < _JOIN_BATCH_S:
            return
        try:
            self._driver.add_tasks([w.task_index for w in joining])
        except Exception as error:
            for worker in joining:
                self._drop(worker, f"the job driver refused it: {error}", failure=False)
            return
        logger.info(
            "RayExecutor (elastic): worker(s) %s on node(s) %s join; %d live",
            [w.task_index for w in joining],
            sorted({w.node_id[:12] for w in joining}),
            len(self._driver.live_tasks()),
        )
        for worker in joining:
            worker.member = True
            self._start_run(worker)

    def _start_run(self, worker: _Worker) -> None:
        location = worker.location or {}
        worker.pid = int(location.get("pid", 0))
        env = dict(self.extra_env_vars)
        env.update(self._driver.worker_env(worker.task_index))
        env["KOLO_HOSTNAME"] = f"ray-node-{worker.node_id[:12]}"
        env["KOLO_RAY_NODE_ID"] = worker.node_id
        env["PYTHONUNBUFFERED"] = "1"
        if self.params.use_gpu:
            # Ray makes only the actor's own GPUs visible: they are devices 0..n-1.
            gpus = location.get("gpu_ids") or []
            env["KOLO_GPU_ADDRESSES"] = ",".join(str(i) for i in range(len(gpus)))
        if self._queue is not None:
            worker.actor.set_queue.remote(self._queue)
        fn, args, kwargs, with_executable = self._call
        executable = self.executable if with_executable else None
        worker.run_ref = worker.actor.run_elastic.remote(
            env, fn, args, kwargs, with_executable, executable
        )

    def _on_returned(self, worker: _Worker, ref: Any) -> None:
        import ray

        try:
            value = ray.get(ref)
        except ray.exceptions.RayActorError as error:
            self._drop(worker, f"its Ray actor died: {_first_line(str(error))}")
            return
        except ray.exceptions.RayTaskError as error:
            cause = self._driver.failure()
            if cause is not None:
                raise self._job_error(cause) from None
            self._drop(worker, f"it raised: {_last_line(str(error))}", traceback=str(error))
            return
        worker.done = True
        self._results[worker.task_index] = value
        self._last_assignment = self._driver.assignment() or self._last_assignment

    def _drop(
        self, worker: _Worker, reason: str, failure: bool = True, traceback: str = ""
    ) -> None:
        """Removes ``worker`` from the job and kills its actor; a failure blacklists its host."""
        import ray

        self.workers.pop(worker.task_index, None)
        if worker.member:
            try:
                self._driver.remove_task(worker.task_index, reason)
            except Exception as error:
                logger.debug("remove_task(%d): %s", worker.task_index, error)
        try:
            ray.kill(worker.actor, no_restart=True)
        except Exception as error:
            logger.debug("ray.kill: %s", error)
        self._gone.append(worker.actor)
        if failure:
            logger.warning(
                "RayExecutor (elastic): worker %d on node %s left the job: %s",
                worker.task_index,
                worker.node_id[:12],
                reason,
            )
            self._failures.append(_Failure(worker.task_index, worker.host, reason, traceback))
            self.hosts.blacklist(worker.host)
        else:
            logger.info(
                "RayExecutor (elastic): worker %d on node %s stopped: %s",
                worker.task_index,
                worker.node_id[:12],
                reason,
            )

    def _check_driver_removals(self) -> None:
        """Workers the job driver removed by itself (no heartbeats, a failure report)."""
        live = set(self._driver.live_tasks())
        for worker in list(self.workers.values()):
            if worker.member and not worker.done and worker.task_index not in live:
                self._drop(worker, "the job driver removed it (it stopped sending heartbeats)")

    def _rediscover(self) -> None:
        """Horovod's discovery step: workers on hosts no longer reported leave; free slots of
        the plan (hosts in order, up to ``max_workers``) get new workers."""
        try:
            change = self.hosts.update()
        except Exception as error:  # a transient discovery failure: retry next time
            logger.warning("RayExecutor: host discovery failed: %s", error)
            return
        plan = plan_slots(self.hosts.available(), self.params.max_workers)
        if change:
            logger.info("RayExecutor (elastic): hosts changed; slots now %s", _short(plan))
        by_host: dict[str, list[_Worker]] = {}
        for worker in self.workers.values():
            by_host.setdefault(worker.host, []).append(worker)
        discovered = {host for host, _ in self.hosts.available()}
        for host, workers in by_host.items():
            excess = len(workers) - plan.get(host, 0)
            if self.hosts.is_blacklisted(host):
                reason = "its host is blacklisted"
            elif host not in discovered:
                reason = "its host left the cluster (the discovery no longer reports it)"
            else:
                reason = "its host has fewer slots now, or max_workers is reached"
            for worker in sorted(workers, key=lambda w: -w.task_index)[: max(0, excess)]:
                self._drop(worker, reason, failure=False)
        for host, count in plan.items():
            for _ in range(count - len(by_host.get(host, []))):
                self._spawn(host, member=False)

    def _check_min_workers(self) -> None:
        live = len(self._driver.live_tasks())
        if live >= self.params.min_workers:
            self._below_min_since = None
            return
        now = time.monotonic()
        if self._below_min_since is None:
            self._below_min_since = now
            logger.warning(
                "RayExecutor (elastic): %d live worker(s), fewer than min_workers=%d; waiting "
                "up to elastic_timeout=%g s for more",
                live,
                self.params.min_workers,
                self.params.elastic_timeout,
            )
        elif now - self._below_min_since > self.params.elastic_timeout + 5.0:
            raise self._min_workers_error(live)

    def _note_round(self) -> None:
        assignment = self._driver.assignment()
        if not assignment:
            return
        tasks = tuple(sorted(int(row["task_index"]) for row in assignment))
        if tasks == self._round:
            return
        self._round = tasks
        self._last_assignment = assignment
        self.round_sizes.append(len(tasks))
        nodes = {row["hostname"] for row in assignment}
        logger.info(
            "RayExecutor (elastic): round %d: size %d on %d node(s)",
            len(self.round_sizes) - 1,
            len(tasks),
            len(nodes),
        )

    # -- callbacks, errors, teardown ---------------------------------------------------------

    def _deliver(self, callbacks: Optional[list[Callable[[Any], Any]]]) -> None:
        queue = self._queue
        if queue is None or not callbacks or self._queue_lost:
            return
        while True:
            try:
                if queue.empty():
                    return
                value = queue.get_nowait()
            except Exception as error:  # its actor died: the job goes on without callbacks
                logger.warning("RayExecutor: the callbacks' queue is gone: %s", error)
                self._queue_lost = True
                return
            for callback in callbacks:
                callback(value)

    def _job_error(self, cause: Any) -> Exception:
        rank, host, message = cause
        if self.params.reset_limit is not None and _RESET_LIMIT_ABORT in message:
            return ResetLimitExceededError(self.params.reset_limit)
        if _ELASTIC_TIMEOUT_ABORT in message:
            return self._min_workers_error(len(self._driver.live_tasks()))
        return RankFailedError(
            f"RayExecutor (elastic): the job was aborted: {_last_line(message)}",
            rank=rank,
            host=host,
            task_attempt=0,
            remote_traceback=message,
        )

    def _min_workers_error(self, live: int) -> Exception:
        return TimeoutError(
            f"RayExecutor: only {live} worker(s) were running, fewer than "
            f"min_workers={self.params.min_workers}, for longer than "
            f"elastic_timeout={self.params.elastic_timeout:g} s. Add nodes (a worker needs "
            f"{self.params.slot_description()}), lower min_workers or raise elastic_timeout."
        )

    def _all_lost(self) -> Exception:
        first = self._failures[0] if self._failures else None
        if first is None:
            return RankFailedError(
                "RayExecutor (elastic): no worker is left and none returned (no slot was usable)"
            )
        return RankFailedError(
            f"RayExecutor (elastic): every worker failed or was lost, so no worker holds the "
            f"training state; the first, worker {first.task_index} on host {first.host}: "
            f"{first.reason}",
            host=first.host,
            task_index=first.task_index,
            task_attempt=0,
            remote_traceback=first.traceback or first.reason,
        )

    def _teardown(self, reason: Optional[str], callbacks: Any) -> None:
        import ray

        driver = self._driver
        if driver is not None and reason is not None:
            driver.abort(f"RayExecutor: {reason}")
        if callbacks and self._queue is not None:
            try:
                self._deliver(callbacks)
            except Exception as error:
                logger.warning("RayExecutor: a callback raised during teardown: %s", error)
        if reason is None:
            _leave([w.actor for w in self.workers.values() if w.done])
        actors = [w.actor for w in self.workers.values()] + self._gone
        self.workers = {}
        self._gone = []
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as error:
                logger.debug("ray.kill: %s", error)
        _wait_gone(actors)
        if self._queue is not None:
            try:
                self._queue.shutdown()
            except Exception as error:
                logger.debug("queue shutdown: %s", error)
            self._queue = None
        if driver is not None:
            driver.shutdown()
        self._driver = None

    def abort(self) -> None:
        """``shutdown()`` during the run (from another thread): the job driver aborts the
        workers at once and the run's own thread stops everything and raises
        :class:`~kolo.exceptions.LaunchError`."""
        self._aborted = True
        driver = self._driver
        if driver is not None:
            driver.abort("RayExecutor: shutdown() was called during the run")


def _leave(actors: list[Any]) -> None:
    """Has the workers that returned leave the job together (bounded), so their connections
    and shared memory are released before they are killed."""
    import ray

    refs = []
    for actor in actors:
        try:
            refs.append(actor.leave_job.remote())
        except Exception as error:
            logger.debug("leave_job: %s", error)
    if refs:
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=_LEAVE_WAIT_S)
        if pending:
            logger.warning("RayExecutor: %d worker(s) did not leave the job in time", len(pending))


def _wait_gone(actors: list[Any]) -> None:
    import ray

    pings = []
    for actor in actors:
        try:
            pings.append(actor.ping.remote())
        except Exception:
            pass
    deadline = time.monotonic() + _KILL_WAIT_S
    while pings and time.monotonic() < deadline:
        ready, pings = ray.wait(pings, num_returns=len(pings), timeout=_POLL_S)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:
                pass
    if pings:
        logger.warning("RayExecutor: %d actor(s) still alive after shutdown", len(pings))


#: Frameworks a new worker imports before it joins, when the driver process has them loaded.
_FRAMEWORKS = ("torch", "tensorflow", "keras")


def _warm_modules(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The frameworks (and kolo's adapters for them) ``fn`` uses and this driver process has
    imported: a new worker imports them before it joins the job, while the others keep
    training (importing torch takes seconds). Only what ``fn`` names (modules it refers to, or
    imports in its body or nested functions): importing every framework the driver holds could
    load two that cannot share a process (TensorFlow and torch each bring an LLVM)."""
    named: set[str] = set()
    code_objects = [getattr(fn, "__code__", None)]
    scope = getattr(fn, "__globals__", {})
    while code_objects:
        code = code_objects.pop()
        if code is None:
            continue
        for name in code.co_names:
            value = scope.get(name)
            module = value.__name__ if isinstance(value, types.ModuleType) else name
            named.update(module.split(".")[:2])
        code_objects.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    loaded = [name for name in _FRAMEWORKS if name in named and name in sys.modules]
    return tuple(loaded) + tuple(f"kolo.{name}" for name in loaded)


def _node_of(host: str) -> Optional[str]:
    """The alive Ray node a discovered host names: a node id, or a node's IP (the first alive
    node with it)."""
    import ray

    by_ip: dict[str, str] = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        if node["NodeID"] == host:
            return host
        by_ip.setdefault(node.get("NodeManagerAddress", ""), node["NodeID"])
    return by_ip.get(host)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown"


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else "failed"


def _short(plan: dict[str, int]) -> dict[str, int]:
    return {host[:12]: count for host, count in plan.items()}
