"""Horovod 0.28.1's semantics at the edges of kolo.torch, on 2 real ranks under kolorun: the
gradients of broadcast, allgather, reducescatter and the grouped ops; pre/post-scaling bit for
bit against a NumPy re-implementation of Horovod's ``ScaleBufferCPUImpl``; ``join()`` with
allgather and broadcast; ``broadcast_optimizer_state`` before any gradient (with ``model=``);
``sparse_allreduce_async``; and Horovod's exception classes (``RuntimeError``,
``HorovodInternalError``) for a mismatch and a killed peer. Also Horovod's names and
signatures (``horovod.torch.mpi_ops``, ``horovod.common.exceptions``) and pickling of every
exception class."""

from __future__ import annotations

import inspect
import os
import pickle
import re

import pytest

from conftest import output_tail, run_kolorun, worker

#: The public names of ``horovod/torch/mpi_ops.py`` at v0.28.1 (its collectives, autograd
#: functions, basics and re-exported process-set and exception names).
HOROVOD_MPI_OPS_NAMES = """
Adasum Average Compression HorovodAllgather HorovodAllreduce HorovodAlltoall HorovodBroadcast
HorovodGroupedAllgather HorovodGroupedAllreduce HorovodGroupedReducescatter HorovodInternalError
HorovodReducescatter Max Min ProcessSet Product Sum add_process_set allgather allgather_async
allreduce allreduce_ allreduce_async allreduce_async_ alltoall alltoall_async barrier broadcast
broadcast_ broadcast_async broadcast_async_ ccl_built cross_rank cross_size cuda_built ddl_built
global_process_set gloo_built gloo_enabled grouped_allgather grouped_allgather_async
grouped_allreduce grouped_allreduce_ grouped_allreduce_async grouped_allreduce_async_
grouped_reducescatter grouped_reducescatter_async handle_average_backwards_compatibility init
is_homogeneous is_initialized join local_rank local_size mpi_built mpi_enabled
mpi_threads_supported nccl_built poll rank reducescatter reducescatter_async remove_process_set
rocm_built shutdown size sparse_allreduce_async start_timeline stop_timeline synchronize
""".split()

#: Names ``horovod/torch/__init__.py`` imports from ``mpi_ops`` (everything ``hvd.`` offers
#: there besides the functions/optimizer/compression/sync_batch_norm names).
HOROVOD_TORCH_FROM_MPI_OPS = [
    n for n in HOROVOD_MPI_OPS_NAMES if not n.startswith("Horovod") or n == "HorovodInternalError"
]
HOROVOD_TORCH_FROM_MPI_OPS.remove("handle_average_backwards_compatibility")
HOROVOD_TORCH_FROM_MPI_OPS.remove("Compression")


@pytest.fixture(scope="module")
def semantics_run():
    result = run_kolorun(["-np", "2", "python", worker("torch_semantics_worker.py")], timeout=240)
    return result


def checks_of(stdout: str, rank: int) -> dict[str, str]:
    return dict(re.findall(rf"\[{rank}\]<stdout>:CHECK (\S+) (ok|FAIL.*)", stdout))


@pytest.mark.parametrize(
    "group",
    [
        "grad/",
        "scale/allreduce/",
        "scale/reducescatter/",
        "join/",
        "optimizer_state/",
        "sparse_allreduce_async/",
        "exceptions/",
    ],
)
def test_every_edge_matches_horovod_on_both_ranks(semantics_run, group: str) -> None:
    out = semantics_run.stdout
    #: How many checks each group runs (scaling: 7 dtypes x Sum/Average x 4 factor pairs).
    expected = {"scale/allreduce/": 56, "scale/reducescatter/": 7, "join/": 5, "grad/": 8}
    for rank in (0, 1):
        checks = {k: v for k, v in checks_of(out, rank).items() if k.startswith(group)}
        assert checks, (
            f"rank {rank} ran no {group} check:\n{out[-3000:]}\n{semantics_run.stderr[-3000:]}"
        )
        failed = {k: v for k, v in checks.items() if v != "ok"}
        assert not failed, f"rank {rank}: {failed}"
        assert len(checks) == expected.get(group, len(checks)), sorted(checks)


def test_the_semantics_run_passes(semantics_run) -> None:
    assert semantics_run.returncode == 0, (
        semantics_run.stdout[-3000:] + semantics_run.stderr[-3000:]
    )
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:rank {rank}:" in semantics_run.stdout
        assert (
            f"[{rank}]<stdout>:mismatch raised MismatchError (a RuntimeError)"
            in semantics_run.stdout
        )


def test_a_killed_peer_raises_a_runtime_error_and_horovod_internal_error() -> None:
    result = run_kolorun(
        ["-np", "2", "python", worker("torch_semantics_worker.py"), "kill"], timeout=120
    )
    assert result.returncode != 0, "kolorun succeeded although rank 1 was killed"
    match = re.search(
        r"\[0\]<stdout>:killed peer: (\w+) runtime=True horovod_internal=(\w+)", result.stdout
    )
    assert match, output_tail(result)
    assert match.group(1) in ("JobAbortedError", "PeerConnectionError"), match.group(1)
    assert match.group(2) == "True"


def test_horovod_mpi_ops_names_are_kolo_torch_names() -> None:
    import kolo.torch as hvd
    import kolo.torch.mpi_ops as mpi_ops

    missing = [n for n in HOROVOD_MPI_OPS_NAMES if not hasattr(mpi_ops, n)]
    assert not missing, f"kolo.torch.mpi_ops lacks {missing}"
    assert sorted(mpi_ops.__all__) == sorted(HOROVOD_MPI_OPS_NAMES)
    for name in HOROVOD_TORCH_FROM_MPI_OPS:
        assert getattr(hvd, name) is getattr(mpi_ops, name), name
    assert hvd.mpi_ops is mpi_ops


def test_horovod_signatures() -> None:
    import kolo.torch as hvd

    def params(fn) -> list[str]:
        return list(inspect.signature(fn).parameters)

    assert params(hvd.broadcast_optimizer_state)[:3] == ["optimizer", "root_rank", "model"]
    assert params(hvd.sparse_allreduce_async) == ["tensor", "name", "op", "process_set"]
    forward = hvd.mpi_ops.HorovodAllreduce.forward
    assert params(forward)[1:] == [
        "tensor",
        "average",
        "name",
        "op",
        "prescale_factor",
        "postscale_factor",
        "process_set",
    ]
    assert params(hvd.mpi_ops.HorovodReducescatter.forward)[1:] == [
        "tensor",
        "name",
        "op",
        "process_set",
        "prescale_factor",
        "postscale_factor",
    ]


def test_exception_classes_are_horovods_builtins_and_pickle() -> None:
    import kolo.exceptions as exc
    from kolo.common import exceptions as common

    assert common.HorovodInternalError is exc.InternalError is exc.HorovodInternalError
    for cls in (
        exc.InternalError,
        exc.MismatchError,
        exc.JobAbortedError,
        exc.PeerConnectionError,
        exc.TimeoutError,
    ):
        assert issubclass(cls, RuntimeError) and issubclass(cls, common.HorovodInternalError)
        assert issubclass(cls, exc.KoloError)
    assert issubclass(exc.InvalidArgumentError, ValueError)
    assert issubclass(exc.InvalidValueError, ValueError)
    assert issubclass(exc.NotInitializedError, ValueError)
    # Horovod raises NotImplementedError (a RuntimeError) where it cannot run Adasum (a
    # number of ranks that is not a power of two); its reducescatter test expects a
    # RuntimeError for Adasum.
    assert issubclass(exc.NotSupportedError, NotImplementedError)
    assert issubclass(exc.NotSupportedError, exc.InvalidArgumentError)
    from kolo._core import Adasum, check_adasum, resolve_op

    assert resolve_op(Adasum, None) is Adasum
    with pytest.raises(NotImplementedError, match="non-power of 2 ranks"):
        check_adasum(6)
    check_adasum(8)
    assert issubclass(common.HostsUpdatedInterrupt, RuntimeError)
    assert not issubclass(common.HostsUpdatedInterrupt, common.HorovodInternalError)
    assert issubclass(common.HorovodVersionMismatchError, ImportError)

    for name in exc.__all__:
        cls = getattr(exc, name)
        if cls is exc.HostsUpdatedInterrupt:
            err = cls(True)
        else:
            err = cls("what went wrong")
        clone = pickle.loads(pickle.dumps(err))
        assert type(clone) is cls, name
        assert clone.args == err.args, name
        assert cls.__module__ == "kolo.exceptions", name
    interrupt = pickle.loads(pickle.dumps(common.HostsUpdatedInterrupt(skip_sync=True)))
    assert interrupt.skip_sync is True
    mismatch = pickle.loads(pickle.dumps(common.HorovodVersionMismatchError("torch", "2.1", "2.0")))
    assert (mismatch.name, mismatch.version, mismatch.installed_version) == ("torch", "2.1", "2.0")


def test_horovod_common_util_helpers(monkeypatch) -> None:
    import kolo.torch as hvd
    from kolo.common import util

    for name in ("mpi_built", "gloo_built", "nccl_built", "ddl_built", "ccl_built"):
        assert getattr(util, name)(verbose=True) == getattr(hvd, name)(), name
    monkeypatch.setenv("KOLO_TEST_KEPT", "before")
    monkeypatch.delenv("KOLO_TEST_NEW", raising=False)
    with util.env(KOLO_TEST_KEPT="during", KOLO_TEST_NEW="new", KOLO_TEST_NONE=None):
        assert os.environ["KOLO_TEST_KEPT"] == "during"
        assert os.environ["KOLO_TEST_NEW"] == "new"
        assert "KOLO_TEST_NONE" not in os.environ
    assert os.environ["KOLO_TEST_KEPT"] == "before"
    assert "KOLO_TEST_NEW" not in os.environ
