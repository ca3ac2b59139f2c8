"""A lone allreduce on an idle job (issue 25): how long one small allreduce takes when every rank
was idle (nothing submitted anywhere for many cycle times) before it, under the tree
negotiation and under all-to-all, interleaved in the same run.

    python bench/idle_lone_op.py [--ranks 8,16] [--repeats 2] [--iterations 30]
        [--idle-ms 30] [--timeout 300] [--json PATH]

Each job is ``kolorun -np N`` of this file's rank mode (numpy ranks, kolo's numpy layer, no
framework loaded) with ``KOLO_NEGOTIATION=<tree|all_to_all>``. Each rank, ``--iterations``
times: an allreduce that lines the ranks up, ``--idle-ms`` of idleness, then one timed 4-byte
allreduce. A rank's figure is the median of its timed calls; the job's is the median and the
maximum over ranks. Not run in CI. The machine is shared: run it on an idle one for figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PROTOCOLS = ("all_to_all", "tree")
MARK = "LONE "


def rank_main(iterations: int, idle_ms: float) -> int:
    """One rank: prints ``LONE {json}`` with its median lone-op latency."""
    import numpy as np

    import kolo
    from kolo import _core, _lifecycle

    # kolo's numpy layer without the packages' __init__ (which load Keras/TensorFlow).
    sys.path.insert(0, str(REPO / "tests" / "workers"))
    from scale_rank_worker import numpy_layer

    _arrays, _ = numpy_layer()

    _lifecycle.init()
    world = kolo.global_process_set
    value = np.ones(1, dtype=np.float32)
    times = []
    for i in range(iterations + 3):
        _arrays.allreduce([value], ["line.up"], _core.Sum, 1.0, 1.0, world)
        time.sleep(idle_ms / 1000)
        began = time.perf_counter()
        (got,) = _arrays.allreduce([value], [f"lone.{i}"], _core.Sum, 1.0, 1.0, world)
        took = time.perf_counter() - began
        if float(got[0]) != float(_core.size()):
            raise AssertionError(f"allreduce gave {got[0]}, expected {_core.size()}")
        if i >= 3:  # the first ones connect and warm up
            times.append(took)
    report = {"rank": _core.rank(), "median_us": statistics.median(times) * 1e6}
    sys.stdout.flush()
    os.write(1, (MARK + json.dumps(report) + "\n").encode())
    _lifecycle.shutdown()
    return 0


def run_job(n: int, protocol: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOLO_")}
    env["KOLO_NEGOTIATION"] = protocol
    command = [
        "kolorun",
        "-np",
        str(n),
        sys.executable,
        __file__,
        "--rank",
        "--iterations",
        str(args.iterations),
        "--idle-ms",
        str(args.idle_ms),
    ]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=args.timeout, check=False
    )
    medians = [
        json.loads(line.split(MARK, 1)[1])["median_us"]
        for line in done.stdout.splitlines()
        if MARK in line
    ]
    if done.returncode != 0 or len(medians) != n:
        tail = (done.stdout + done.stderr)[-2000:]
        raise SystemExit(f"{protocol} at {n} ranks failed (exit {done.returncode}):\n{tail}")
    return {"median_us": statistics.median(medians), "max_us": max(medians)}


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", default="8,16")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--idle-ms", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.rank:
        return rank_main(args.iterations, args.idle_ms)
    rows = []
    for n in [int(s) for s in args.ranks.split(",")]:
        for repeat in range(args.repeats):
            for protocol in PROTOCOLS:
                row = {"n": n, "protocol": protocol, "repeat": repeat, **run_job(n, protocol, args)}
                rows.append(row)
                print(
                    f"n={n:3d} {protocol:10s} repeat {repeat}: lone allreduce median over ranks "
                    f"{row['median_us']:8.0f} us, slowest rank {row['max_us']:8.0f} us",
                    flush=True,
                )
    for n in sorted({r["n"] for r in rows}):

        def med(protocol: str, key: str, n: int = n) -> float:
            return statistics.median(
                r[key] for r in rows if r["n"] == n and r["protocol"] == protocol
            )

        print(
            f"n={n}: tree / all_to_all, median "
            f"{med('tree', 'median_us') / med('all_to_all', 'median_us'):.2f}x, "
            f"slowest {med('tree', 'max_us') / med('all_to_all', 'max_us'):.2f}x"
        )
    load = os.getloadavg()[0]
    document = {"bench": "idle_lone_op", "load_average": load, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = args.json or RESULTS / f"idle_lone_op-{stamp}.json"
    path.write_text(json.dumps(document, indent=1))
    print(json.dumps(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
