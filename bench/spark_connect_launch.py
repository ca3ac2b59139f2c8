"""Launch time of a trivial ``kolo.spark.run`` on Spark Connect vs a classic session.

One classic ``local[2]`` SparkSession and one Spark Connect server (``local[2]``, from the
pyspark package, on 127.0.0.1; ``tests/support/spark.py``) in the same run; each round runs
``kolo.spark.run(lambda: rank, num_proc=2)`` on both, alternating which goes first. Prints the
medians and the Connect/classic ratio, and writes JSON (``bench/results/``).

Example::

    .venv/bin/python bench/spark_connect_launch.py --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from common import write_results  # noqa: E402
from support.spark import (  # noqa: E402
    local_session_builder,
    start_connect_server,
    stop_process_group,
)

import kolo.spark  # noqa: E402


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (after a warm-up)")
    parser.add_argument("--json", type=Path, default=None, help="results file")
    return parser.parse_args(argv)


def trivial() -> int:
    import os

    return int(os.environ["KOLO_RANK"])


def launch_s(session: Any) -> float:
    started = time.monotonic()
    assert kolo.spark.run(trivial, num_proc=2, spark=session) == [0, 1]
    return time.monotonic() - started


def main(argv: Optional[list[str]] = None) -> None:
    import cloudpickle
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    args = parse_args(argv)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    classic = local_session_builder().getOrCreate()
    classic.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory(prefix="kolo-bench-connect-") as logs:
        url, server = start_connect_server(Path(logs))
        try:
            connect = ConnectSession.builder.remote(url).getOrCreate()
            sessions = {"classic": classic, "connect": connect}
            for session in sessions.values():  # warm-up: JIT, Python workers, the Python check
                launch_s(session)
            runs: dict[str, list[float]] = {name: [] for name in sessions}
            for round_ in range(args.rounds):
                names = list(sessions) if round_ % 2 == 0 else list(sessions)[::-1]
                for name in names:
                    runs[name].append(launch_s(sessions[name]))
                print(
                    f"round {round_}: " + ", ".join(f"{n} {runs[n][-1]:.2f} s" for n in sessions),
                    flush=True,
                )
            connect.stop()
        finally:
            stop_process_group(server)
    medians = {name: statistics.median(values) for name, values in runs.items()}
    ratio = medians["connect"] / medians["classic"]
    print(
        f"trivial kolo.spark.run launch (num_proc=2), median of {args.rounds}: classic "
        f"{medians['classic']:.2f} s, Spark Connect {medians['connect']:.2f} s -> ratio "
        f"{ratio:.2f}"
    )
    write_results(
        "spark_connect_launch",
        {"rounds": args.rounds, "median_s": medians, "ratio": ratio, "runs_s": runs},
        args.json,
    )
    classic.stop()


if __name__ == "__main__":
    main()
