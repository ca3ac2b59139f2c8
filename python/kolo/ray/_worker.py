"""The actor behind each rank of a :class:`kolo.ray.RayExecutor` (internal).

The actor process *is* the rank: :meth:`_RankActor.setup` puts the job's ``KOLO_*`` variables
into ``os.environ``, registers with the job driver at once (the launcher-neutral session
``kolo._native.session_join``, as a Spark rank process does), sets the rank variables, and only
then builds the user's executable (:meth:`BaseHorovodWorker.start_executable`), so
``hvd.init()`` inside it or inside any later function adopts that registration (the same rank).
"""

from __future__ import annotations

import logging
import os
import socket
import traceback
from typing import Any, Callable, Optional

from kolo.ray.worker import BaseHorovodWorker


class _RankActor(BaseHorovodWorker):
    """One rank (a Horovod ``BaseHorovodWorker``); wrapped with ``ray.remote`` by the executor."""

    def location(self, warm_modules: tuple = ()) -> dict[str, Any]:
        """Where the actor runs: Ray node id and IP, hostname, pid, assigned GPU ids; first
        imports ``warm_modules`` (an elastic worker joins the job only once they are loaded,
        so the running workers do not wait for its framework to import)."""
        import importlib

        import ray

        for name in warm_modules:
            try:
                importlib.import_module(name)
            except Exception as error:  # the function's own import will say what is wrong
                logging.getLogger("kolo.ray").debug("warm-up import of %s: %s", name, error)

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "gpu_ids": [str(gpu) for gpu in ray.get_gpu_ids()],
        }

    def setup(
        self,
        env: dict[str, str],
        host_label: str,
        executable_cls: Optional[Callable[..., Any]],
        executable_args: tuple,
        executable_kwargs: dict,
    ) -> dict[str, str]:
        """Joins the job (blocks until every rank registered) and builds the executable."""
        from kolo import _native

        os.environ.update(env)
        rank_vars = _native.session_join()
        for name, value in rank_vars:
            os.environ[name] = value
        _native.session_post_started(0, host_label, os.getpid())
        if executable_cls is not None:
            self._call(self.start_executable, executable_cls, executable_args, executable_kwargs)
        return dict(rank_vars)

    def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``fn(*args, **kwargs)``; a raise is reported to the driver, then re-raised."""
        return self._call(fn, *args, **kwargs)

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)``; a raise is reported to the driver, then re-raised."""
        return self._call(fn, self.executable)

    def run_elastic(
        self,
        env: dict[str, str],
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        with_executable: bool,
        executable: Optional[tuple[Callable[..., Any], tuple, dict]],
    ) -> Any:
        """One worker of an elastic run: sets the job's variables, builds the executable (for
        ``execute``) and runs ``fn`` (its ``hvd.init()`` registers with the job driver; its
        ``hvd.elastic.run`` loop resets as the job's membership changes). The worker stays in
        the job after ``fn`` returns (others may still finish their last collectives) until
        :meth:`leave_job`."""
        os.environ.update(env)
        if with_executable:
            if executable is not None:
                self.start_executable(*executable)
            return fn(self.executable)
        return fn(*args, **kwargs)

    def leave_job(self) -> None:
        """``hvd.shutdown()`` if the function left kolo initialized: its connections and shared
        memory are released before the actor is stopped (every worker of the run has returned
        by then)."""
        from kolo import _core, _lifecycle

        if _core.is_initialized():
            _lifecycle.shutdown()

    def ping(self) -> bool:
        """True (the executor uses it to see an actor is gone)."""
        return True

    @staticmethod
    def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException:
            from kolo import _native

            try:
                _native.session_fail(traceback.format_exc())
            except Exception:
                pass
            raise


def start_rank_actor(
    *, num_cpus: float, num_gpus: float, scheduling_strategy: Any, world_rank: int, world_size: int
) -> Any:
    """Starts one :class:`_RankActor` that Ray never restarts nor retries (a lost rank is the
    job's to handle: the fixed job aborts, the elastic job replaces it)."""
    import ray

    return (
        ray.remote(_RankActor)
        .options(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            max_restarts=0,
            max_task_retries=0,
            scheduling_strategy=scheduling_strategy,
        )
        .remote(world_rank=world_rank, world_size=world_size)
    )
