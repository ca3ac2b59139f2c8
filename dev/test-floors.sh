#!/usr/bin/env bash
# Tests the extras' version floors (pyproject.toml [project.optional-dependencies]) as a user
# who gets the oldest versions pip may choose: runs dev/test-installed-wheel.sh on WHEEL with
# kolo's own dependencies and kolo[spark,torch] pinned to their floors
# (dev/installed_wheel/floor_constraints.py), i.e. a fresh virtualenv, every package file,
# `kolorun --check-build`, a 2-rank kolo.torch job and examples/spark_torch_estimator.py.
# Not part of CI (it downloads the floor versions: PySpark 3.5's ~320 MB sdist and its build the
# first time); run it by hand after changing a floor. docs/install.md lists the results.
#
# Usage: dev/test-floors.sh WHEEL
#
# torch: the floor (2.1) with its CUDA wheels is ~3 GB. If KOLO_FLOORS_TORCH_PYTHON (default:
# the Horovod bench environment's python, ~/.cache/kolo-bench/horovod-venv, which
# bench/peers/horovod.sh builds with torch 2.1.2) has a torch of the floor's minor series, that
# torch is lent (as dev/test-installed-wheel.sh lends .venv's) and pinned at its version;
# otherwise pip downloads torch at the floor.
# Python: the venv's Python is .venv's (3.11 here). Floors without a wheel for it are raised to
# the first release that has one (numpy 1.22 -> 1.23.2 on 3.11; floor_constraints.py says which).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: dev/test-floors.sh WHEEL" >&2; exit 2; }
MAIN_PY="$REPO/.venv/bin/python"
[ -x "$MAIN_PY" ] || { echo "dev/test-floors.sh: run dev/setup.sh first" >&2; exit 2; }

constraints=$(mktemp "${TMPDIR:-/tmp}/kolo-floors.XXXXXX")
trap 'rm -f "$constraints"' EXIT
torch_py=${KOLO_FLOORS_TORCH_PYTHON:-$HOME/.cache/kolo-bench/horovod-venv/bin/python}
lend=()
torch_floor=$("$MAIN_PY" "$REPO/dev/installed_wheel/floor_constraints.py" torch | sed -n 's/^torch==//p')
lent_version=$("$torch_py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
# The lent torch must be a release of the floor's minor series (2.1.x for >=2.1).
if [ -n "$lent_version" ] && [ "$(cut -d. -f1,2 <<<"$lent_version")" = "$(cut -d. -f1,2 <<<"$torch_floor")" ]; then
  echo "== floors: torch $lent_version lent from $torch_py"
  lend=(--torch-from "$torch_py")
  "$MAIN_PY" "$REPO/dev/installed_wheel/floor_constraints.py" --lent "torch==$lent_version" \
    spark torch >"$constraints"
else
  echo "== floors: no torch ${torch_floor%.*}.x to lend (KOLO_FLOORS_TORCH_PYTHON): pip downloads torch $torch_floor"
  # Lend nothing (an empty directory): pip installs torch at the floor with its CUDA wheels.
  lend=(--no-lend)
  "$MAIN_PY" "$REPO/dev/installed_wheel/floor_constraints.py" spark torch >"$constraints"
fi
echo "== floors: the constraints"
cat "$constraints"
"$REPO/dev/test-installed-wheel.sh" --constraints "$constraints" "${lend[@]}" "$1"
