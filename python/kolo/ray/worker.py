"""Horovod's Ray worker actor class, ``BaseHorovodWorker`` (``horovod.ray.worker``).

:class:`kolo.ray.RayExecutor`'s actors are instances of a subclass of it, so the handles in
``executor.workers`` answer Horovod's calls (``hostname``, ``get_gpu_ids``, ``env_vars``,
``update_env_vars``, ``execute``...), and user code that wraps it with ``ray.remote`` or
subclasses it works as with Horovod. Importing this module does not import Ray.

Example::

    import ray
    from kolo.ray import BaseHorovodWorker

    worker = ray.remote(BaseHorovodWorker).remote(world_rank=0, world_size=1)
    ray.get(worker.update_env_vars.remote({"MY_FLAG": 1}))
    assert ray.get(worker.env_vars.remote())["MY_FLAG"] == "1"
"""

from __future__ import annotations

import os
import socket
import warnings
from typing import Any, Callable, Dict, List, Optional

__all__ = ["BaseHorovodWorker", "log"]

_queue: Any = None


def log(info_dict: Dict[str, Any]) -> None:
    """Puts ``info_dict`` on the queue a worker was given with
    :meth:`BaseHorovodWorker.set_queue` (Horovod's ``ray_logger.log``); warns once when no
    queue is set.

    Example::

        kolo.ray.worker.log({"epoch": 1, "loss": 0.3})
    """
    global _warned
    if _queue is not None:
        _queue.put(info_dict)
    elif not _warned:
        warnings.warn("kolo.ray.worker.log called but no queue is set (set_queue)", stacklevel=2)
        _warned = True


_warned = False


class BaseHorovodWorker:
    """A Ray worker of a Horovod job: the rank variables it was built with, its node and
    GPUs, its environment, and the executable it runs functions against.

    Args:
        world_rank: this worker's rank (``HOROVOD_RANK``).
        world_size: the number of workers (``HOROVOD_SIZE``).

    Example::

        class MyWorker(BaseHorovodWorker):
            def ping(self):
                return self.hostname()

        actor = ray.remote(MyWorker).remote(world_rank=1, world_size=2)
    """

    #: What :meth:`start_executable` built (None until then).
    executable: Any = None

    def __init__(self, world_rank: int = 0, world_size: int = 1) -> None:
        os.environ["HOROVOD_HOSTNAME"] = self.node_id()
        os.environ["HOROVOD_RANK"] = str(world_rank)
        os.environ["HOROVOD_SIZE"] = str(world_size)

    def node_id(self) -> str:
        """The Ray node id (hex) this worker runs on.

        Example::

            ray.get(worker.node_id.remote())
        """
        import ray

        return ray.get_runtime_context().get_node_id()

    def hostname(self) -> str:
        """This worker's hostname.

        Example::

            ray.get(worker.hostname.remote())
        """
        return socket.gethostname()

    def get_gpu_ids(self) -> List[int]:
        """The CUDA device ids Ray gave this worker.

        Example::

            ray.get(worker.get_gpu_ids.remote())     # [] without GPUs
        """
        import ray

        return ray.get_gpu_ids()

    def update_env_vars(self, env_vars: Dict[str, Any]) -> None:
        """Sets environment variables in the worker process (values turned into strings).

        Example::

            ray.get(worker.update_env_vars.remote({"NCCL_DEBUG": "INFO"}))
        """
        os.environ.update({str(k): str(v) for k, v in env_vars.items()})

    def env_vars(self) -> Dict[str, str]:
        """The worker process's environment.

        Example::

            ray.get(worker.env_vars.remote())["HOROVOD_RANK"]
        """
        return dict(os.environ)

    def start_executable(
        self,
        executable_cls: Optional[Callable[..., Any]] = None,
        executable_args: Optional[list] = None,
        executable_kwargs: Optional[dict] = None,
    ) -> None:
        """Builds ``executable_cls(*executable_args, **executable_kwargs)`` as
        :attr:`executable` (nothing when ``executable_cls`` is None).

        Example::

            ray.get(worker.start_executable.remote(MyModel, [0.1]))
        """
        if executable_cls:
            self.executable = executable_cls(*(executable_args or []), **(executable_kwargs or {}))

    def execute(self, func: Callable[[Any], Any]) -> Any:
        """``func(self.executable)``.

        Example::

            ray.get(worker.execute.remote(lambda model: model.step()))
        """
        return func(self.executable)

    def set_queue(self, queue: Any) -> None:
        """Sets the queue :func:`log` puts messages on in this worker (multi-node logging).

        Example::

            from ray.util.queue import Queue
            queue = Queue()
            ray.get(worker.set_queue.remote(queue))
        """
        global _queue
        _queue = queue
