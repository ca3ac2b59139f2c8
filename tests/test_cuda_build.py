"""The CUDA build on a machine without a GPU: the wheel carries the `cuda` feature, finds the
libraries it can (torch's nvidia wheels), and reports truthfully that CUDA/NCCL cannot run."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kolo.torch as hvd
from conftest import run_kolorun, worker_env
from kolo import _native
from kolo.exceptions import ConfigError, KoloError
from kolo.torch import nccl

HAS_DRIVER = Path("/proc/driver/nvidia/version").exists()
no_driver = pytest.mark.skipif(HAS_DRIVER, reason="checks the report of a machine without GPU")


def _nccl_wheel() -> tuple[Path, str] | None:
    """torch's NCCL wheel (nvidia-nccl-cu12 or -cu13): the library file and its version."""
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        try:
            files = importlib.metadata.files(dist) or []
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in files:
            if f.name == "libnccl.so.2":
                return Path(f.locate()).resolve(), version
    return None


def _probe_in_child(env: dict[str, str]) -> dict:
    """The probe of a fresh process (libraries are loaded once per process)."""
    code = "import json; from kolo import _native; print(json.dumps(dict(_native.cuda_probe())))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=worker_env(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_wheel_is_built_with_cuda_and_consistent() -> None:
    found = nccl.probe()
    assert found["built"], "the wheel is built with the cuda feature (pyproject.toml)"
    info = _native.build_info()
    assert info["cuda"] == found["cuda"] == hvd.cuda_built()
    assert info["nccl"] == found["nccl"] == hvd.nccl_built()
    assert not found["nccl"] or found["cuda"], "NCCL needs CUDA"


@no_driver
def test_without_a_driver_nothing_claims_to_run() -> None:
    found = nccl.probe()
    assert not hvd.cuda_built() and not hvd.nccl_built()
    assert not found["pack_kernel"]
    assert "libcuda.so.1" in found["cuda_error"]
    assert not torch.cuda.is_available()


def test_torchs_nccl_wheel_is_found_and_its_version_read() -> None:
    wheel = _nccl_wheel()
    found = nccl.probe()
    if wheel is None:
        assert "nccl_error" in found and "KOLO_NCCL_LIBRARY" in found["nccl_error"]
        return
    path, version = wheel
    assert Path(found["nccl_path"]).resolve() == path
    # The wheel's version (2.30.7, or 2.30.7.post1) starts with what ncclGetVersion says.
    assert version.startswith(found["nccl_version"]), (version, found["nccl_version"])


def test_kolo_nccl_library_names_the_file_to_load(tmp_path) -> None:
    wheel = _nccl_wheel()
    if wheel is None:
        found = _probe_in_child({"KOLO_NCCL_LIBRARY": str(tmp_path / "libnccl.so.2")})
        assert str(tmp_path / "libnccl.so.2") in found["nccl_error"]
        return
    copy = tmp_path / "libnccl.so.2"
    shutil.copy(wheel[0], copy)
    found = _probe_in_child({"KOLO_NCCL_LIBRARY": str(copy)})
    assert found["nccl_path"] == str(copy)
    # A path that does not load is passed over for the next candidate.
    found = _probe_in_child({"KOLO_NCCL_LIBRARY": str(tmp_path / "missing.so")})
    assert Path(found["nccl_path"]).resolve() == wheel[0]


def test_check_build_reports_what_was_found() -> None:
    result = run_kolorun(["--check-build"], timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "GPU support (found at run time):" in out
    found = nccl.probe()
    assert f"{'[X]' if found['cuda'] else '[ ]'} CUDA driver" in out
    assert f"{'[X]' if found['nccl'] else '[ ]'} NCCL\n" in out
    if "nccl_version" in found:
        assert f"[X] NCCL: {found['nccl_version']}" in out


@no_driver
def test_cuda_paths_fail_with_a_typed_error_without_a_gpu() -> None:
    with pytest.raises(ConfigError, match=r"libcuda\.so\.1"):
        nccl.require_nccl()
    with pytest.raises(KoloError, match=r"libcuda\.so\.1"):
        _native.Gpu(0)
    code = (
        "import kolo.torch as hvd\n"
        "from kolo.torch.nccl import NcclGroup\n"
        "from kolo.exceptions import ConfigError\n"
        "hvd.init()\n"
        "try:\n    NcclGroup()\n"
        "except ConfigError as err:\n    print('typed:', err)\n"
        "hvd.shutdown()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "typed: CUDA tensors cannot use NCCL here" in out.stdout, out.stderr


def test_the_engine_still_runs_cpu_collectives_with_the_cuda_build() -> None:
    code = (
        "import torch, kolo.torch as hvd\n"
        "hvd.init()\n"
        "x = hvd.allreduce(torch.arange(4.0) * (hvd.rank() + 1), op=hvd.Sum)\n"
        "print(x.tolist())\n"
        "hvd.shutdown()\n"
    )
    result = run_kolorun(["-np", "2", sys.executable, "-c", code], timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("[0.0, 3.0, 6.0, 9.0]") == 2, result.stdout


@no_driver
def test_the_gpu_benchmark_says_it_needs_a_gpu() -> None:
    script = Path(__file__).resolve().parents[1] / "bench" / "gpu.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert "needs a CUDA GPU" in result.stdout


def test_device_submissions_are_checked_before_the_engine() -> None:
    code = (
        "import kolo.torch as hvd\n"
        "from kolo import _native\n"
        "from kolo.exceptions import InvalidArgumentError\n"
        "hvd.init()\n"
        "cases = [('allgather', 'float32', 7, 'host-staged path'),\n"
        "         ('allreduce', 'int16', 7, 'not int16'),\n"
        "         ('allreduce', 'float32', 0, 'a ready event')]\n"
        "for kind, dtype, event, expect in cases:\n"
        "    try:\n"
        "        _native.submit(kind, 'x', 0, 0, [0], dtype, device=0, ready_event=event)\n"
        "        print('accepted', kind)\n"
        "    except InvalidArgumentError as err:\n"
        "        print('refused', expect in str(err), err)\n"
        "hvd.shutdown()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=worker_env(), capture_output=True, text=True, timeout=60
    )
    assert out.stdout.count("refused True") == 3, out.stdout + out.stderr
