"""``KoloEnvironment``: Lightning's view of a kolo job (a ``ClusterEnvironment``).

The processes are started by a kolo launcher (``kolorun -np N``, :func:`kolo.spark.run`,
:class:`kolo.ray.RayExecutor`), ``mpirun`` or ``srun``, and the ranks come from kolo's runtime
(``hvd.rank()``, ``hvd.size()``, ``hvd.local_rank()``, ``hvd.cross_rank()``) after
``hvd.init()``, which the first query here calls. Lightning never starts processes or a
``torch.distributed`` group for it.

Example::

    env = KoloEnvironment()
    print(env.global_rank(), env.world_size())   # 0 1 when launched bare
"""

from __future__ import annotations

import logging

from lightning.fabric.plugins.environments import ClusterEnvironment

__all__ = ["KoloEnvironment"]

log = logging.getLogger(__name__)

#: Open MPI's switch for a singleton ``MPI_Init`` that starts no ``orted`` daemon.
SINGLETON_ISOLATED = "OMPI_MCA_ess_singleton_isolated"


def isolate_mpi_singleton() -> None:
    """Let an ``MPI_Init`` in a process no MPI launcher started skip Open MPI's daemon.

    A ``Trainer``/``Fabric`` given a strategy by name picks its cluster environment before the
    strategy: ``MPIEnvironment.detect()`` imports mpi4py (when installed) and asks
    ``MPI.COMM_WORLD`` its size, so every rank kolorun, Spark or Ray started does a singleton
    ``MPI_Init``. Open MPI then forks an ``orted`` per rank, which on a loaded host can fail
    ("Unable to start a daemon on the local node") and abort the rank. The answer is always 1
    there, and kolo's strategy keeps its own ``KoloEnvironment``, so the daemon buys nothing:
    set ``OMPI_MCA_ess_singleton_isolated=1`` unless the user chose a value or ``mpirun``/``srun``
    started the process (where ``MPI_Init`` joins the launcher's job and needs no singleton).
    """
    import os

    from kolo._mpi_launch import launcher_rank

    if launcher_rank() is None:
        os.environ.setdefault(SINGLETON_ISOLATED, "1")


def _hvd():  # type: ignore[no-untyped-def]
    """``kolo.torch``, initialized."""
    import kolo.torch as hvd

    if not hvd.is_initialized():
        hvd.init()
    return hvd


class KoloEnvironment(ClusterEnvironment):
    """Ranks and sizes from kolo's runtime; processes are created by the kolo launcher.

    Example::

        from lightning.pytorch import Trainer
        from kolo.lightning import KoloStrategy

        trainer = Trainer(strategy=KoloStrategy(cluster_environment=KoloEnvironment()))
    """

    @property
    def creates_processes_externally(self) -> bool:
        """Always ``True``: ``kolorun`` / ``kolo.spark.run`` / ``RayExecutor`` start them."""
        return True

    @property
    def main_address(self) -> str:
        """Not used by kolo (its driver service does the rendezvous); ``127.0.0.1``."""
        return "127.0.0.1"

    @property
    def main_port(self) -> int:
        """Not used by kolo; ``0``."""
        return 0

    @staticmethod
    def detect() -> bool:
        """``True`` when a launcher started this process as a rank: a kolo launcher
        (``KOLO_RANK``, or ``HOROVOD_RANK`` as horovodrun sets it), or ``mpirun`` (Open MPI,
        MPICH) / ``srun``, recognized as ``hvd.init()`` recognizes them (see docs/mpi.md).

        Example::

            if KoloEnvironment.detect():
                print("started as a rank")
        """
        import os

        from kolo._mpi_launch import launcher_rank

        if "KOLO_RANK" in os.environ or "HOROVOD_RANK" in os.environ:
            return True
        return launcher_rank() is not None

    def world_size(self) -> int:
        """``hvd.size()``."""
        return _hvd().size()

    def set_world_size(self, size: int) -> None:
        """Ignored: the launcher decides the number of processes (``kolorun -np N``)."""
        if size != self.world_size():
            log.debug("ignoring world size %d: kolo's job has %d ranks", size, self.world_size())

    def global_rank(self) -> int:
        """``hvd.rank()``."""
        return _hvd().rank()

    def set_global_rank(self, rank: int) -> None:
        """Ignored: kolo's driver assigns the ranks."""

    def local_rank(self) -> int:
        """``hvd.local_rank()``: the position of this process on its host."""
        return _hvd().local_rank()

    def node_rank(self) -> int:
        """``hvd.cross_rank()``: the ordinal of this host."""
        return _hvd().cross_rank()
