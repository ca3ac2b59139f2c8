"""The cost of authentication: two kolo builds side by side, interleaved, in one run.

    python bench/security_overhead.py --build before=/path/to/old/python \
        --build after=/path/to/new/python [--rounds 5] [--json PATH]

Each ``--build NAME=DIR`` is a directory holding a built ``kolo`` package (a checkout's
``python/`` after ``maturin develop`` or ``/work/wt-tools/build-native.sh``-style builds). Every
round runs, for each build in turn (so machine noise hits both alike), in fresh processes with
``PYTHONPATH=DIR``:

- (a) **driver call**: an in-process ``LaunchDriver`` and one worker session; the time of one
  ``session_send`` round trip (median of 2,000), and of ``session_join`` (connect, authenticate,
  register, get the assignment);
- (b) **mesh setup**: ``kolorun -np 2``; rank 0 times ``hvd.shutdown(); hvd.init()`` (driver
  registration plus the data-plane mesh, and shared memory with transport ``auto``), median of
  re-inits, for ``KOLO_TRANSPORT=tcp`` and ``auto``;
- (c) **allreduce** of 4 KiB and 64 MiB float32 (median over rounds of the mean call time,
  slowest rank's), for both transports.

It prints one line per figure with each build's median and the ratio of every build to the
first, and writes JSON to ``bench/results/security_overhead-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROBE = HERE / "_security_probe.py"


def run_probe(pythonpath: str, mode: str, transport: str = "auto") -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": pythonpath, "KOLO_TRANSPORT": transport}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "figures.json"
        if mode == "driver":
            cmd = [sys.executable, str(PROBE), "driver", str(out)]
        else:
            kolorun = Path(sys.executable).with_name("kolorun")
            cmd = [str(kolorun), "-np", "2", sys.executable, str(PROBE), "ranks", str(out)]
        subprocess.run(cmd, env=env, check=True, timeout=600, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--build", action="append", required=True, help="NAME=DIR (repeat)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    builds = dict(item.split("=", 1) for item in args.build)

    samples: dict[str, dict[str, list[float]]] = {name: {} for name in builds}
    for round_index in range(args.rounds):
        for name, path in builds.items():
            figures = run_probe(path, "driver")
            for transport in ("tcp", "auto"):
                figures.update(
                    {f"{k}[{transport}]": v for k, v in run_probe(path, "ranks", transport).items()}
                )
            for key, value in figures.items():
                samples[name].setdefault(key, []).append(value)
        print(f"round {round_index + 1}/{args.rounds} done", flush=True)

    first = next(iter(builds))
    results: dict[str, Any] = {}
    for key in samples[first]:
        medians = {name: statistics.median(samples[name][key]) for name in builds}
        ratios = {name: medians[name] / medians[first] for name in builds}
        results[key] = {"median": medians, f"ratio_to_{first}": ratios}
        text = " | ".join(f"{name} {medians[name]:10.2f} ({ratios[name]:.3f}x)" for name in builds)
        print(f"{key:28s} {text}", flush=True)

    sys.path.insert(0, str(HERE))
    os.environ["PYTHONPATH"] = builds[first]
    record = {
        "bench": "security_overhead",
        "builds": builds,
        "rounds": args.rounds,
        "samples": samples,
        "results": results,
    }
    out = args.json or HERE / "results" / "security_overhead.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
