"""The Python API on a single rank (no launcher): results, typed errors, autograd, pickling."""

from __future__ import annotations

import importlib.util
import pickle
import subprocess
import sys

import pytest
import torch

import kolo.torch as hvd
from kolo import exceptions


@pytest.fixture(scope="module", autouse=True)
def single_rank():
    hvd.init()
    yield
    hvd.shutdown()


def test_bare_process_is_rank_0_of_1() -> None:
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    assert (hvd.cross_rank(), hvd.cross_size(), hvd.is_homogeneous()) == (0, 1, True)


def test_single_rank_results_apply_ops_and_scaling() -> None:
    x = torch.tensor([1.0, -2.0, 3.0])
    assert torch.equal(hvd.allreduce(x), x)
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5), x)
    assert torch.equal(hvd.allreduce(x, op=hvd.Max, postscale_factor=3.0), x * 3)
    # Adasum on one rank: the tensor itself (scaled), as in Horovod.
    assert torch.equal(hvd.allreduce(x, op=hvd.Adasum, postscale_factor=0.5), x * 0.5)
    assert hvd.grouped_allreduce([x, x.half()], op=hvd.Adasum)[1].dtype == torch.float16
    assert torch.equal(hvd.allgather(x.reshape(3, 1)), x.reshape(3, 1))
    assert torch.equal(hvd.broadcast(x, root_rank=0), x)
    out, received = hvd.alltoall(x, splits=[3])
    assert torch.equal(out, x) and received.tolist() == [3]
    assert torch.equal(hvd.reducescatter(x.reshape(3, 1), op=hvd.Sum), x.reshape(3, 1))
    assert hvd.broadcast_object({"k": [1, 2]}) == {"k": [1, 2]}
    assert hvd.allgather_object("a") == ["a"]
    hvd.barrier()


def test_inplace_ops_write_into_non_contiguous_tensors() -> None:
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    view = base.t()
    assert not view.is_contiguous()
    hvd.allreduce_(view, op=hvd.Sum, postscale_factor=2.0)
    assert torch.equal(base, torch.arange(12, dtype=torch.float64).reshape(3, 4) * 2)


def test_fp16_compression_round_trips_dtype() -> None:
    x = torch.tensor([0.5, 1.5], dtype=torch.float32)
    out = hvd.allreduce(x, compression=hvd.Compression.fp16)
    assert out.dtype == torch.float32 and torch.equal(out, x)


def test_allreduce_is_differentiable() -> None:
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum) * torch.tensor([3.0, 4.0])).sum().backward()
    assert x.grad.tolist() == [3.0, 4.0]
    y = torch.ones(2, 2, requires_grad=True)
    hvd.allgather(y).sum().backward()
    assert torch.equal(y.grad, torch.ones(2, 2))


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64)), "complex64"),
        (lambda: hvd.allreduce(torch.ones(2, dtype=torch.bool), op=hvd.Average), "Average"),
        (lambda: hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum), "Adasum"),
        (lambda: hvd.allreduce(torch.ones(2), op=hvd.Sum, average=True), "not both"),
        (lambda: hvd.allgather(torch.tensor(1.0)), "0-dim"),
        (lambda: hvd.alltoall(torch.ones(4), splits=[1, 3]), "1 ranks"),
        (lambda: hvd.alltoall(torch.ones(4), splits=[5]), "splits"),
        (lambda: hvd.broadcast(torch.ones(2), root_rank=3), "root"),
        (lambda: hvd.init(comm="COMM_WORLD"), "a list of COMM_WORLD ranks or an mpi4py"),
    ],
)
def test_bad_input_raises_a_typed_error_naming_the_problem(call, fragment) -> None:
    with pytest.raises(exceptions.InvalidArgumentError, match=fragment):
        call()


def test_exceptions_form_a_picklable_hierarchy() -> None:
    assert issubclass(exceptions.JobAbortedError, exceptions.InternalError)
    assert issubclass(exceptions.PeerConnectionError, exceptions.InternalError)
    assert exceptions.HorovodInternalError is exceptions.InternalError
    assert issubclass(exceptions.NotInitializedError, ValueError)
    for cls in (exceptions.MismatchError, exceptions.JobAbortedError, exceptions.ConfigError):
        assert cls.__module__ == "kolo.exceptions"
        clone = pickle.loads(pickle.dumps(cls("what went wrong")))
        assert type(clone) is cls and str(clone) == "what went wrong"


def test_calls_before_init_raise_not_initialized() -> None:
    code = (
        "import torch, kolo.torch as hvd\n"
        "from kolo.exceptions import NotInitializedError\n"
        "for call in (hvd.rank, lambda: hvd.allreduce(torch.ones(1)), hvd.barrier):\n"
        "    try:\n        call()\n"
        "    except NotInitializedError as err:\n        print('ok', err)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.count("ok kolo has not been initialized") == 3, result.stderr


def test_capabilities_send_horovod_scripts_down_the_branch_that_works() -> None:
    """docs/mpi.md: mpi4py makes init(comm=...) work; kolo's transport plays Gloo's role."""
    assert hvd.mpi_built() is (importlib.util.find_spec("mpi4py") is not None)
    assert hvd.gloo_built() is True and hvd.mpi_threads_supported() is True
    assert hvd.mpi_enabled() is False and hvd.nccl_built() == 0
    assert not hvd.cuda_built() and not hvd.rocm_built()


def test_a_child_forked_after_the_runtime_started_gets_a_config_error(tmp_path) -> None:
    """kolo's one runtime (the kolo-runtime crate) refuses a forked child; the binding maps
    that to ``kolo.exceptions.ConfigError`` naming the fix."""
    code = f"""
import os
from kolo.exceptions import ConfigError
from kolo.store import Store
store = Store.create({str(tmp_path)!r})
store.exists("x")  # starts the runtime
pid = os.fork()
if pid == 0:
    try:
        store.exists("x")
    except ConfigError as err:
        os._exit(0 if "forked" in str(err) and "spawn" in str(err) else 2)
    os._exit(3)
_, status = os.waitpid(pid, 0)
raise SystemExit(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
