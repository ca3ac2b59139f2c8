#!/usr/bin/env bash
# Tests the extras' version floors (pyproject.toml [project.optional-dependencies]) as a user
# who gets the oldest versions pip may choose, each part in a fresh virtualenv with WHEEL and
# kolo's own dependencies pinned to their floors too (dev/installed_wheel/floor_constraints.py):
#   spark: kolo[spark,torch] at the floors through dev/test-installed-wheel.sh: every package
#          file, `kolorun --check-build`, a 2-rank kolo.torch job and
#          examples/spark_torch_estimator.py;
#   ray:   kolo[ray,torch] at the floors (with pyarrow's and pandas' from kolo[spark]):
#          examples/ray_executor.py (RayExecutor, 2 workers) from outside the clone;
#   lightning: kolo[lightning] at the floors: `kolorun -np 2` examples/lightning_digits.py.
#   keras: kolo[keras,tensorflow] at the floors: `kolorun -np 2` examples/keras_digits.py.
# Not part of CI (it downloads the floor versions: PySpark 3.5's ~320 MB sdist and its build the
# first time); run it by hand after changing a floor. docs/install.md lists the results.
#
# Usage: dev/test-floors.sh WHEEL [spark] [ray] [lightning] [keras]   (default: all four)
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
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: dev/test-floors.sh WHEEL [spark] [ray] [lightning] [keras]" >&2; exit 2; }
wheel=$(realpath "$1")
shift
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(spark ray lightning keras)
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

# A fresh virtualenv $scratch/$1-venv with WHEEL[$2] (and $3..., pip requirements of the job's
# own) installed under the constraints in $scratch/$1.txt; torch lent when there is one.
floors_venv() {
  local name=$1 extras=$2 base venv="$scratch/$1-venv"
  shift 2
  echo "== floors ($name): the constraints"
  cat "$scratch/$name.txt"
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
  echo "== floors ($name): installing $(basename "$wheel")[$extras]"
  "${pip[@]}" install -c "$scratch/$name.txt" "$wheel[$extras]" "${extra[@]}" "$@"
  "${pip[@]}" check
}

# Runs "$@" in $scratch with the part's virtualenv first on PATH and no PYTHONPATH.
in_venv() {
  local name=$1
  shift
  (cd "$scratch" && env -u PYTHONPATH PATH="$scratch/$name-venv/bin:$PATH" PYTHONUNBUFFERED=1 "$@" 2>&1)
}

ray_part() {
  # With the spark extra's floors as well: ray[data] pulls pyarrow and pandas, and today's
  # pyarrow refuses numpy 1.x at import without declaring it (pip would pair it with numpy's floor).
  "${FLOORS[@]}" ray torch spark | grep -v '^pyspark==' >"$scratch/ray.txt"
  floors_venv ray ray,torch
  cp "$REPO/examples/ray_executor.py" "$scratch/"
  echo "== floors (ray): examples/ray_executor.py from outside the clone"
  in_venv ray python ray_executor.py | tee "$scratch/ray-out.txt"
  grep -q '^simple_fn ranks: \[0, 1\]' "$scratch/ray-out.txt" &&
    grep -q '^weights after 3 steps, by rank:' "$scratch/ray-out.txt" ||
    { echo "floors (ray): examples/ray_executor.py did not finish" >&2; return 1; }
  echo "== floors (ray): passed"
}

lightning_part() {
  "${FLOORS[@]}" lightning >"$scratch/lightning.txt"
  # scikit-learn: the example's own dependency (its digits data set), not kolo's.
  floors_venv lightning lightning scikit-learn
  cp "$REPO/examples/lightning_digits.py" "$scratch/"
  echo "== floors (lightning): kolorun -np 2 python examples/lightning_digits.py"
  in_venv lightning kolorun -np 2 python lightning_digits.py | tee "$scratch/lightning-out.txt"
  grep -q 'test accuracy: ' "$scratch/lightning-out.txt" ||
    { echo "floors (lightning): examples/lightning_digits.py printed no test accuracy" >&2; return 1; }
  echo "== floors (lightning): passed"
}

keras_part() {
  # kolo[keras,tensorflow]: Keras 3 on its TensorFlow backend, both at their floors.
  # numpy at TensorFlow 2.16.1's own floor on Python 3.11 (1.23.5), above kolo's.
  "${FLOORS[@]}" keras tensorflow | sed 's/^numpy==.*/numpy==1.23.5/' >"$scratch/keras.txt"
  # scikit-learn: the example's own dependency (its digits data set), not kolo's; pinned to
  # releases with wheels for that numpy (newer SciPy needs a newer numpy and builds from source).
  floors_venv keras keras,tensorflow scikit-learn==1.3.2 scipy==1.11.4
  cp "$REPO/examples/keras_digits.py" "$scratch/"
  echo "== floors (keras): kolorun -np 2 python examples/keras_digits.py"
  in_venv keras env KERAS_BACKEND=tensorflow kolorun -np 2 python keras_digits.py |
    tee "$scratch/keras-out.txt"
  grep -q 'test accuracy' "$scratch/keras-out.txt" ||
    { echo "floors (keras): examples/keras_digits.py printed no test accuracy" >&2; return 1; }
  echo "== floors (keras): passed"
}

for part in "${parts[@]}"; do
  case "$part" in
    spark) spark_part ;;
    ray) ray_part ;;
    lightning) lightning_part ;;
    keras) keras_part ;;
    *) echo "dev/test-floors.sh: unknown part $part (spark, ray, lightning or keras)" >&2; exit 2 ;;
  esac
done
