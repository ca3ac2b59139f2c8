#!/usr/bin/env bash
# Tests the extras' version floors (pyproject.toml [project.optional-dependencies]) as a user
# who gets the oldest versions pip may choose, each part in a fresh virtualenv with WHEEL and
# kolo's own dependencies pinned to their floors too (dev/installed_wheel/floor_constraints.py):
#   spark: kolo[spark,torch] at the floors through dev/test-installed-wheel.sh: every package
#          file, `kolorun --check-build`, a 2-rank kolo.torch job and
#          examples/spark_torch_estimator.py;
#   ray:   kolo[ray,torch] at the floors (with pyarrow's and pandas' from kolo[spark]):
#          examples/ray_executor.py (RayExecutor, 2 workers) from outside the clone.
# Not part of CI (it downloads the floor versions: PySpark 3.5's ~320 MB sdist and its build the
# first time); run it by hand after changing a floor. docs/install.md lists the results.
#
# Usage: dev/test-floors.sh WHEEL [spark] [ray]   (default: both)
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
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: dev/test-floors.sh WHEEL [spark] [ray]" >&2; exit 2; }
wheel=$(realpath "$1")
shift
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(spark ray)
MAIN_PY="$REPO/.venv/bin/python"
[ -x "$MAIN_PY" ] || { echo "dev/test-floors.sh: run dev/setup.sh first" >&2; exit 2; }
FLOORS=("$MAIN_PY" "$REPO/dev/installed_wheel/floor_constraints.py")

scratch=$(mktemp -d "${TMPDIR:-/tmp}/kolo-floors.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
torch_py=${KOLO_FLOORS_TORCH_PYTHON:-$HOME/.cache/kolo-bench/horovod-venv/bin/python}
torch_floor=$("${FLOORS[@]}" torch | sed -n 's/^torch==//p')
lent_version=$("$torch_py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
# The lent torch must be a release of the floor's minor series (2.1.x for >=2.1).
if [ -n "$lent_version" ] &&
  [ "$(cut -d. -f1,2 <<<"$lent_version")" = "$(cut -d. -f1,2 <<<"$torch_floor")" ]; then
  echo "== floors: torch $lent_version lent from $torch_py"
  lend=(--torch-from "$torch_py")
  FLOORS+=(--lent "torch==$lent_version")
else
  echo "== floors: no torch ${torch_floor%.*}.x to lend (KOLO_FLOORS_TORCH_PYTHON): pip downloads torch $torch_floor"
  lend=(--no-lend)
  torch_py=""
fi

spark_part() {
  "${FLOORS[@]}" spark torch >"$scratch/spark.txt"
  echo "== floors (spark): the constraints"
  cat "$scratch/spark.txt"
  "$REPO/dev/test-installed-wheel.sh" --constraints "$scratch/spark.txt" "${lend[@]}" "$wheel"
}

ray_part() {
  # With the spark extra's floors as well: ray[data] pulls pyarrow and pandas, and today's
  # pyarrow refuses numpy 1.x at import without declaring it (pip would pair it with numpy's floor).
  "${FLOORS[@]}" ray torch spark | grep -v '^pyspark==' >"$scratch/ray.txt"
  echo "== floors (ray): the constraints"
  cat "$scratch/ray.txt"
  local base venv="$scratch/ray-venv"
  base=$("$MAIN_PY" -c 'import sys; print(sys._base_executable)')
  "$base" -m venv "$venv"
  local pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet) extra=()
  if [ -n "$torch_py" ]; then
    local site
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$torch_py" "$REPO/dev/installed_wheel/borrow_torch.py" "$scratch/lent" >"$scratch/torch-req.txt"
    echo "$scratch/lent" >"$site/kolo_lent_torch.pth"
    extra=(-r "$scratch/torch-req.txt")
  fi
  echo "== floors (ray): installing $(basename "$wheel")[ray,torch]"
  "${pip[@]}" install -c "$scratch/ray.txt" "$wheel[ray,torch]" "${extra[@]}"
  "${pip[@]}" check
  cp "$REPO/examples/ray_executor.py" "$scratch/"
  echo "== floors (ray): examples/ray_executor.py from outside the clone"
  (cd "$scratch" && env -u PYTHONPATH PATH="$venv/bin:$PATH" PYTHONUNBUFFERED=1 \
    "$venv/bin/python" ray_executor.py 2>&1) | tee "$scratch/ray-out.txt"
  grep -q '^simple_fn ranks: \[0, 1\]' "$scratch/ray-out.txt" &&
    grep -q '^weights after 3 steps, by rank:' "$scratch/ray-out.txt" ||
    { echo "floors (ray): examples/ray_executor.py did not finish" >&2; return 1; }
  echo "== floors (ray): passed"
}

for part in "${parts[@]}"; do
  case "$part" in
    spark) spark_part ;;
    ray) ray_part ;;
    *) echo "dev/test-floors.sh: unknown part $part (spark or ray)" >&2; exit 2 ;;
  esac
done
