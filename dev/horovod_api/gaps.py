"""Shows or rewrites the committed list of Horovod API items kolo does not cover yet
(``python/tests/fixtures/horovod_api_gaps.txt``), which ``test_horovod_api.py`` ratchets.

Example::

    PYTHONPATH=python python dev/horovod_api/gaps.py           # the figure and the changes
    PYTHONPATH=python python dev/horovod_api/gaps.py --write   # rewrite the gap list
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import api_coverage as coverage

HEADER = (
    "# Horovod 0.28.1 API items (in scope of issue 19) that kolo does not cover yet.\n"
    "# One '<category> <Horovod name>' per line; python/tests/test_horovod_api.py fails when\n"
    "# an item not listed here is uncovered (a regression) or a listed one is covered.\n"
    "# Regenerate: PYTHONPATH=python python dev/horovod_api/gaps.py --write\n"
)


def main(argv: Optional[List[str]] = None) -> None:
    """Prints the figure and how the gap list differs from kolo today; ``--write`` rewrites
    it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the gap list")
    args = parser.parse_args(argv)
    checks = coverage.run_checks(coverage.load_data())
    print("\n".join(coverage.figure(checks)))
    now = coverage.gaps(checks)
    listed = coverage.read_gap_file() if coverage.GAPS_FILE.exists() else []
    for key in sorted(set(now) - set(listed)):
        print(f"newly uncovered: {key}")
    for key in sorted(set(listed) - set(now)):
        print(f"now covered: {key}")
    if args.write:
        coverage.GAPS_FILE.write_text(HEADER + "".join(f"{key}\n" for key in now))
        print(f"wrote {coverage.GAPS_FILE}: {len(now)} gaps")


if __name__ == "__main__":
    main()
