"""``kolorun``: launch a command as N ranks, locally and over ssh (Horovod's ``horovodrun``).

Example::

    kolorun -np 2 python train.py
    kolorun -np 4 -H host1:2,host2:2 python train.py

The launcher itself is native (``kolo._native.kolorun``); this module is its console entry
point and answers ``--check-build``.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Optional

from kolo import _native
from kolo.exceptions import ConfigError, KoloError

__all__ = ["check_build", "main"]

_FRAMEWORKS = [
    ("TensorFlow", "tensorflow"),
    ("PyTorch", "torch"),
    ("Keras", "keras"),
    ("PyTorch Lightning", "lightning"),
    ("MXNet", "mxnet"),
]


def _mark(flag: bool) -> str:
    return "[X]" if flag else "[ ]"


def check_build() -> str:
    """The ``--check-build`` report: frameworks importable here, controllers and transports."""
    info = _native.build_info()
    lines = [f"kolo v{info['version']}:", "", "Available Frameworks:"]
    for label, module in _FRAMEWORKS:
        lines.append(f"    {_mark(importlib.util.find_spec(module) is not None)} {label}")
    lines += [
        "",
        "Available Controllers:",
        f"    {_mark(True)} kolo driver service (gRPC)",
        f"    {_mark(False)} MPI",
        f"    {_mark(False)} Gloo",
        "",
        "Available Tensor Operations:",
        f"    {_mark(info['tcp'])} TCP",
        f"    {_mark(info['shm'])} Shared memory",
        f"    {_mark(info['nccl'])} NCCL",
        f"    {_mark(False)} DDL",
        f"    {_mark(False)} CCL",
        f"    {_mark(False)} MPI",
        f"    {_mark(False)} Gloo",
        "",
        "GPU support (found at run time):",
        *_gpu_lines(),
    ]
    return "\n".join(lines)


def _gpu_lines() -> list[str]:
    found = _native.cuda_probe()
    if not found["built"]:
        return ["    this kolo was built without the `cuda` feature"]

    def line(label: str, ok: bool, detail: str) -> str:
        return f"    {_mark(ok)} {label}: {detail}"

    driver = (
        f"CUDA {found['driver_version'] // 1000}.{found['driver_version'] % 1000 // 10}, "
        f"{found['devices']} GPU(s)"
        if "driver_version" in found
        else found.get("cuda_error", "")
    )
    return [
        line("CUDA driver", found["cuda"], driver),
        line(
            "NCCL",
            "nccl_version" in found,
            f"{found['nccl_version']} ({found['nccl_path']})"
            if "nccl_version" in found
            else found.get("nccl_error", ""),
        ),
        line(
            "NVRTC (fusion pack kernel)",
            "nvrtc_version" in found,
            f"{found['nvrtc_version']} ({found['nvrtc_path']})"
            if "nvrtc_version" in found
            else found.get("nvrtc_error", ""),
        ),
    ]


def _wants_check_build(args: list[str]) -> bool:
    for arg in args:
        if arg == "--check-build":
            return True
        if not arg.startswith("-"):
            return False
    return False


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point of the ``kolorun`` console script; exits with the job's status."""
    args = sys.argv[1:] if argv is None else list(argv)
    if _wants_check_build(args):
        print(check_build())
        sys.exit(0)
    try:
        code = _native.kolorun(args)
    except ConfigError as err:
        print(f"kolorun: error: {err}", file=sys.stderr)
        print("kolorun: run 'kolorun --help' for usage", file=sys.stderr)
        sys.exit(2)
    except KoloError as err:
        print(f"kolorun: {type(err).__name__}: {err}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("kolorun: interrupted; every rank was stopped", file=sys.stderr)
        sys.exit(130)
    sys.exit(code)


if __name__ == "__main__":
    main()
