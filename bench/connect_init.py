"""Start-up cost of the data plane: ``KOLO_CONNECT=eager`` (every rank connects to every other
at ``init()``, the previous design) against ``lazy`` (the default: a rank connects to a peer when
a collective first needs it), with real processes under ``kolorun``.

    python bench/connect_init.py [--ranks 2,4,8,16] [--repeats 3] [--transport tcp] [--json PATH]

Each run starts ``n`` ranks that import ``kolo.torch``, then record ``time.time()`` (one
machine, one clock) before ``hvd.init()``, after it, and after a first small allreduce and a
first ring-only step (an allreduce of 1 M floats runs the ring), plus their connection counters
(``kolo.engine_stats()``). Figures per run, each up to the slowest rank:

- init: from the last rank entering ``init()`` (the others wait for it in the rendezvous
  anyway) to the last rank leaving it;
- first collective: from the same point to the last rank finishing the first allreduce
  (with today's all-to-all negotiation this connects every pair in the lazy mode too);
- connections per rank after ``init()`` (max over ranks).

``--transport tcp`` (the default) makes the ranks of this one machine behave as ranks on
separate hosts; with ``auto`` the ranks of one host share memory and connect to each other at
``init()`` in both modes. Eager and lazy run interleaved (alternating which goes first), each
figure is the median over ``--repeats``, and the ratio eager / lazy is printed. Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

RANK_PROGRAM = r"""
import json, time
import kolo, kolo.torch as hvd, torch
start = time.time()
hvd.init()
inited = time.time()
after_init = kolo.engine_stats()["connections_opened"]
hvd.allreduce(torch.ones(4), name="first")
first = time.time()
print("CONNECT_INIT " + json.dumps({
    "rank": hvd.rank(), "start": start, "inited": inited, "first": first,
    "after_init": after_init,
    "after_first": kolo.engine_stats()["connections_opened"],
}), flush=True)
hvd.shutdown()
"""


def run_once(n: int, mode: str, transport: str) -> dict[str, Any]:
    """One job of ``n`` ranks in connection mode ``mode``; returns its figures."""
    env = dict(os.environ, KOLO_CONNECT=mode, KOLO_TRANSPORT=transport, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        ["kolorun", "-np", str(n), sys.executable, "-c", RANK_PROGRAM],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    rows = [
        json.loads(line.split("CONNECT_INIT ", 1)[1])
        for line in proc.stdout.splitlines()
        if "CONNECT_INIT " in line
    ]
    if proc.returncode != 0 or len(rows) != n:
        raise RuntimeError(
            f"kolorun -np {n} ({mode}) failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    last_in = max(r["start"] for r in rows)
    return {
        "init_s": max(r["inited"] for r in rows) - last_in,
        "first_collective_s": max(r["first"] for r in rows) - last_in,
        "connections_after_init": max(r["after_init"] for r in rows),
        "connections_after_first": max(r["after_first"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,4,8,16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--transport", default="tcp", choices=["tcp", "auto"])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sizes = [int(x) for x in args.ranks.split(",")]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        str(n): {"eager": [], "lazy": []} for n in sizes
    }
    for repeat in range(args.repeats):
        for n in sizes:
            order = ("eager", "lazy") if repeat % 2 == 0 else ("lazy", "eager")
            for mode in order:
                runs[str(n)][mode].append(run_once(n, mode, args.transport))
    summary = {}
    for n in sizes:
        med = {
            mode: {
                key: statistics.median(r[key] for r in runs[str(n)][mode])
                for key in runs[str(n)][mode][0]
            }
            for mode in ("eager", "lazy")
        }
        ratio_init = med["eager"]["init_s"] / med["lazy"]["init_s"]
        ratio_first = med["eager"]["first_collective_s"] / med["lazy"]["first_collective_s"]
        summary[str(n)] = {**med, "init_ratio_eager_over_lazy": ratio_init}
        summary[str(n)]["first_collective_ratio_eager_over_lazy"] = ratio_first
        print(
            f"n={n:3d} init eager {med['eager']['init_s'] * 1e3:8.1f} ms  lazy "
            f"{med['lazy']['init_s'] * 1e3:8.1f} ms  (eager/lazy {ratio_init:5.2f}x)  | "
            f"init + first allreduce eager {med['eager']['first_collective_s'] * 1e3:8.1f} ms "
            f" lazy "
            f"{med['lazy']['first_collective_s'] * 1e3:8.1f} ms ({ratio_first:5.2f}x)  | "
            f"connections/rank after init eager {med['eager']['connections_after_init']:.0f} "
            f"lazy {med['lazy']['connections_after_init']:.0f}",
            flush=True,
        )
    payload = {"transport": args.transport, "repeats": args.repeats, "summary": summary}
    payload["runs"] = runs
    if args.json:
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from common import write_results

        write_results("connect_init", payload)


if __name__ == "__main__":
    main()
