"""Pieces every bench script shares: the results folder, the gloo peer, the small CNN."""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import kolo
import kolo.torch as hvd

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(stem: str, payload: dict[str, Any], out: Optional[Path] = None) -> Path:
    """Writes ``payload`` (plus versions and host) as JSON to ``out`` or
    ``bench/results/<stem>-<time>.json``, prints where, and returns the path."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = out or RESULTS / f"{stem}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "bench": stem,
        "kolo_version": kolo.__version__,
        "torch_version": torch.__version__,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        **payload,
    }
    out.write_text(json.dumps(record, indent=2))
    print(f"wrote {out}", flush=True)
    return out


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_gloo() -> None:
    """Starts torch.distributed (gloo) over the kolo job's ranks, on a port rank 0 picks."""
    port = hvd.broadcast_object(free_port() if hvd.rank() == 0 else None, root_rank=0)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size()
    )


class SmallCNN(nn.Module):
    """Two 3x3 conv layers with pooling, then two linear layers (about 0.5 M parameters)."""

    def __init__(self, num_classes: int = 10, image_size: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * (image_size // 4) ** 2, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def human(nbytes: float) -> str:
    """``nbytes`` as ``"64 MiB"``, ``"4 KiB"`` or ``"8 B"``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def pin_one_core_per_rank(local_rank: Optional[int] = None) -> Optional[int]:
    """Pins this rank to core ``local_rank % cpus`` (default: kolo's local rank); returns the
    core (None where unsupported)."""
    try:
        core = (hvd.local_rank() if local_rank is None else local_rank) % (os.cpu_count() or 1)
        os.sched_setaffinity(0, {core})
        return core
    except (AttributeError, OSError):
        return None


def latest_results(stem: str) -> Optional[Path]:
    """The newest ``bench/results/<stem>-*.json``, or None."""
    found = sorted(RESULTS.glob(f"{stem}-*.json"))
    return found[-1] if found else None


def load_calibration() -> dict[str, Any]:
    """The latest calibration (``bench/calibrate.py``), or a quick one run now (memcpy only,
    not saved) when none was saved yet: the physical-limit denominators other results cite."""
    path = latest_results("calibrate")
    if path is not None:
        record = json.loads(path.read_text())
        record["source"] = str(path)
        return record
    import calibrate  # bench/ is on sys.path when a bench script runs

    return {
        "source": "quick calibration run now",
        "memcpy": calibrate.measure_memcpy([1 << 20, 16 << 20, 64 << 20], budget_s=0.05),
    }
