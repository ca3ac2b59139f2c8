"""Real rank processes at the edge of this machine (issue 25, item 5): n = 8, 16, 32, 64 ranks on
simulated hosts (``KOLO_HOSTNAME``; shared memory within a host, TCP between hosts), today's
design against the new one, interleaved in the same run.

    python bench/scale_ranks.py [--ranks 8,16,32,64] [--hosts 4] [--repeats 1]
        [--iterations 30] [--timeout 600] [--json PATH]

Not run in CI (tests/test_bench_scripts.py runs a tiny configuration). Designs:

- ``today``: ``KOLO_NEGOTIATION=all_to_all KOLO_CONNECT=eager`` (every member sends every
  other member a cycle message; the full TCP mesh is built at ``init``);
- ``new``: kolo's defaults (a tree negotiation and lazy TCP connections once those land; where
  they do not exist yet both designs run the same code and the ratios are ~1).

For each n, repeat and design (the designs alternate), two launches:

1. ``kolorun -np n`` of tests/workers/scale_rank_worker.py ``matrix latency``: numpy ranks
   (kolo's numpy layer; no framework loaded, ~30 MiB PSS each). Figures: init (from just
   before kolorun starts to the last rank's ``init()`` returning: process start, imports,
   rendezvous, data plane), matrix (the slowest rank's pass through the whole checked
   collectives matrix), small-allreduce latency (4 B, 4 KiB, 64 KiB: each rank's median of
   ``--iterations`` calls, then the median over ranks), connections per rank right after
   ``init`` and at the end (the engine's ``connections_open`` statistic where it exists, else
   n/a; the matrix's alltoall needs every pair; and the sockets each rank holds
   open at the end, counted in /proc: data plane, listener, driver), the largest peak RSS of a
   rank and the job's total PSS (shared pages counted once).
2. tests/support/forked_ranks.py: a ``LaunchDriver`` here and n torch ranks forked from one
   process that imported torch (one thread each): ``broadcast_parameters`` then 4 SGD steps
   with ``DistributedOptimizer``, every rank checking its parameters equal everyone's. Figures:
   the median step time (median over ranks), total PSS.

Every rank checks every result; a failed check or a rank that hangs (each collective is
bounded by ``KOLO_COLLECTIVE_TIMEOUT_SECONDS``, each launch by ``--timeout``) is printed and
the run exits 1. Prints a table, the today/new ratios per n, and writes JSON to
bench/results/ (or ``--json``). The machine is shared: run it on an idle one for figures.
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
sys.path.insert(0, str(REPO / "tests"))

from support.forked_ranks import WORKER, run_forked_ranks  # noqa: E402

RESULTS = REPO / "bench" / "results"
#: The designs, in the order each size runs them: today's knobs, then kolo's defaults.
DESIGNS = {
    "today": {"KOLO_NEGOTIATION": "all_to_all", "KOLO_CONNECT": "eager"},
    "new": {},
}
COLUMNS = (
    ("init_s", "init s", "{:.2f}"),
    ("matrix_s", "matrix s", "{:.2f}"),
    ("allreduce_4B_us", "4 B us", "{:.0f}"),
    ("allreduce_4KiB_us", "4 KiB us", "{:.0f}"),
    ("allreduce_64KiB_us", "64 KiB us", "{:.0f}"),
    ("train_step_ms", "train step ms", "{:.1f}"),
    ("connections_at_init", "conns@init", "{:.1f}"),
    ("connections", "conns/rank", "{:.1f}"),
    ("sockets", "sockets/rank", "{:.1f}"),
    ("peak_rss_mib", "peak RSS MiB", "{:.0f}"),
    ("pss_total_mib", "PSS total MiB", "{:.0f}"),
    ("train_pss_total_mib", "train PSS MiB", "{:.0f}"),
)


def base_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment without any ``KOLO_*`` setting (but the log level), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOLO_")}
    if "KOLO_LOG_LEVEL" in os.environ:
        env["KOLO_LOG_LEVEL"] = os.environ["KOLO_LOG_LEVEL"]
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def reports_of(stdout: str) -> dict[int, dict[str, Any]]:
    reports = {}
    for line in stdout.splitlines():
        _, found, text = line.partition("SCALE ")
        if found:
            report = json.loads(text)
            reports[report["rank"]] = report
    return reports


def problems(n: int, reports: dict[int, dict[str, Any]], returncode: int, tail: str) -> list[str]:
    found = [f"rank {r}: {f}" for r, rep in sorted(reports.items()) for f in rep["failures"]]
    if sorted(reports) != list(range(n)):
        found.append(f"{n - len(reports)} of {n} ranks printed no report")
    if returncode != 0 and not found:
        found.append(f"exit code {returncode}")
    if found:
        found.append("output tail:\n" + tail)
    return found


def run_matrix(n: int, hosts: int, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Launch 1 (see the module docs): ``kolorun -np n`` numpy ranks, matrix and latency."""
    launched = time.time()
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "kolorun"),
            "-np",
            str(n),
            sys.executable,
            str(WORKER),
            "matrix",
            "latency",
        ],
        cwd=REPO,
        env=env | {"KOLO_TEST_RANKS_PER_HOST": str(max(1, n // hosts))},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    reports = reports_of(proc.stdout)
    row: dict[str, Any] = {
        "problems": problems(n, reports, proc.returncode, (proc.stdout + proc.stderr)[-3000:])
    }
    if not reports:
        return row
    values = list(reports.values())
    row["init_s"] = max(r["initialised"] for r in values) - launched
    row["matrix_s"] = max(r["matrix_s"] for r in values)
    for key in ("allreduce_4B_us", "allreduce_4KiB_us", "allreduce_64KiB_us"):
        row[key] = statistics.median(r[key] for r in values if key in r)
    conns = [r["connections_open"] for r in values if r.get("connections_open") is not None]
    row["connections"] = statistics.mean(conns) if conns else None
    at_init = [r["connections_at_init"] for r in values if r.get("connections_at_init") is not None]
    row["connections_at_init"] = statistics.mean(at_init) if at_init else None
    row["sockets"] = statistics.mean(r["sockets"] for r in values)
    row["peak_rss_mib"] = max(r["peak_rss_mib"] for r in values)
    row["pss_total_mib"] = sum(r["pss_mib"] for r in values)
    row["hosts"] = values[0]["cross_size"]
    return row


def run_train(n: int, hosts: int, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Launch 2 (see the module docs): ``n`` forked torch ranks, one training run."""
    run = run_forked_ranks(n, max(1, n // hosts), ["train"], timeout, env)
    row: dict[str, Any] = {
        "problems": problems(n, run.reports, run.returncode, (run.stdout + run.stderr)[-3000:])
    }
    if run.reports:
        values = list(run.reports.values())
        row["train_step_ms"] = statistics.median(r["train_step_ms"] for r in values)
        row["train_pss_total_mib"] = sum(r["pss_mib"] for r in values)
        row["train_init_s"] = max(r["initialised"] for r in values) - run.launched
    return row


def fmt(value: Optional[float], pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)


def print_header() -> None:
    print(f"{'n':>3} {'design':>6} " + " ".join(f"{label:>13}" for _, label, _ in COLUMNS))


def print_row(n: int, design: str, row: dict[str, Any]) -> None:
    cells = " ".join(f"{fmt(row.get(key), pattern):>13}" for key, _, pattern in COLUMNS)
    print(f"{n:>3} {design:>6} {cells}", flush=True)


def median_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the repeats (None when a repeat had none)."""
    out: dict[str, Any] = {"problems": [p for row in rows for p in row["problems"]]}
    for key, _, _ in (*COLUMNS, ("train_init_s", "", ""), ("hosts", "", "")):
        values = [row[key] for row in rows if row.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    return out


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,16,32,64", help="comma-separated rank counts")
    parser.add_argument("--hosts", type=int, default=4, help="simulated hosts per job")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=30, help="timed calls per size")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per launch")
    parser.add_argument("--json", type=Path, help="where to write the results")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.ranks.split(",")]
    collective_timeout = str(max(60, int(args.timeout / 2)))
    print(
        f"scale_ranks: n = {sizes} on {args.hosts} simulated hosts, {os.cpu_count()} CPUs, "
        f"designs {list(DESIGNS)} interleaved, {args.repeats} repeat(s)",
        flush=True,
    )
    print_header()
    results: dict[str, dict[str, Any]] = {}
    failed = False
    for n in sizes:
        per_design: dict[str, list[dict[str, Any]]] = {d: [] for d in DESIGNS}
        for _ in range(args.repeats):
            for design, knobs in DESIGNS.items():
                env = base_env(
                    {
                        **knobs,
                        "KOLO_COLLECTIVE_TIMEOUT_SECONDS": collective_timeout,
                        "KOLO_SCALE_ITERATIONS": str(args.iterations),
                    }
                )
                row = run_matrix(n, args.hosts, env, args.timeout)
                train = run_train(n, args.hosts, env, args.timeout)
                row["problems"] += train.pop("problems")
                row.update(train)
                per_design[design].append(row)
        for design, rows in per_design.items():
            row = median_rows(rows)
            results[f"{n}/{design}"] = row
            print_row(n, design, row)
            for problem in row["problems"]:
                failed = True
                print(f"    FAILED at n={n} ({design}): {problem}", flush=True)
    print("\nratios today/new (> 1: the new design is faster or smaller)")
    for n in sizes:
        today, new = results[f"{n}/today"], results[f"{n}/new"]
        parts = []
        for key, label, _ in COLUMNS:
            if today.get(key) and new.get(key):
                parts.append(f"{label} {today[key] / new[key]:.2f}x")
            else:
                parts.append(f"{label} n/a")
        print(f"  n={n:>3}: " + ", ".join(parts))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.json or RESULTS / f"scale_ranks-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"bench": "scale_ranks", "cpus": os.cpu_count(), "hosts": args.hosts}
    out.write_text(json.dumps({**record, "designs": DESIGNS, "results": results}, indent=2))
    print(f"wrote {out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
