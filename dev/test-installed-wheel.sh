#!/usr/bin/env bash
# Tests a built kolo wheel as a user gets it: installs WHEEL with `kolo[spark,torch]` into a
# fresh virtualenv and, from a directory outside the clone (so the repo's python/ is never on
# sys.path), checks that every package file is installed (dev/installed_wheel/
# check_package_data.py: the files git tracks under python/kolo plus the built ones pyproject's
# [tool.maturin] include ships, such as the Spark plugin jar), runs `kolorun --check-build`, a
# 2-rank kolo.torch job (dev/installed_wheel/torch_job.py) and the README's main job
# (examples/spark_torch_estimator.py: TorchEstimator on local[2] Spark). dev/test.sh runs it on
# the wheel dev/build-wheel.sh made. Needs dev/setup.sh's .venv (its Python and its torch).
#
# Usage: dev/test-installed-wheel.sh [--constraints FILE] [--torch-from PYTHON | --no-lend] WHEEL
#
# WHEEL may be the sdist (kolo-<v>.tar.gz) instead: its first `pip install` then builds kolo from
# source (cargo and a Rust toolchain needed; CARGO_TARGET_DIR, if set, reaches cargo) and the
# same checks run on the result.
#
# pip resolves kolo's own dependencies and the spark extra from the wheel's metadata (PyPI),
# constrained to dev/requirements.txt's versions (--constraints FILE: to FILE's instead;
# dev/test-floors.sh passes the extras' floors).
# Only torch and its CUDA wheels (~3 GB) are lent from .venv (dev/installed_wheel/
# borrow_torch.py; --torch-from PYTHON: from that interpreter's environment instead; --no-lend:
# none, pip downloads torch), so pip still checks kolo[torch]'s floor against it. With
# KOLO_WHEEL_CHECK_PIP_CACHE set (.ci/run sets it), pip caches downloads and the PySpark wheel it
# builds there; without it pip follows the environment (PIP_NO_CACHE_DIR and so on).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() {
  echo "usage: dev/test-installed-wheel.sh [--constraints FILE] [--torch-from PYTHON | --no-lend] WHEEL" >&2
  exit 2
}
constraints="" torch_py="" lend=1
while [ $# -gt 1 ]; do
  case "$1" in
    --constraints) constraints=$(realpath "$2"); shift 2 ;;
    --torch-from) torch_py=$2; shift 2 ;;
    --no-lend) lend=0; shift ;;
    *) usage ;;
  esac
done
[ $# -eq 1 ] && [ -f "$1" ] || usage
wheel=$(realpath "$1")
case "$wheel" in
  *.whl) requested="$wheel[spark,torch]" ;;
  # An sdist: install the kolo that the first install built, with the extras (no second build).
  *.tar.gz) requested="kolo[spark,torch]==$(basename "$wheel" .tar.gz | sed 's/^kolo-//')" ;;
  *) usage ;;
esac
MAIN_PY="$REPO/.venv/bin/python"
[ -x "$MAIN_PY" ] || { echo "dev/test-installed-wheel.sh: run dev/setup.sh first" >&2; exit 2; }
torch_py=${torch_py:-$MAIN_PY}
start=$(date +%s)
step() { echo "== installed wheel [$(( $(date +%s) - start )) s]: $*"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/kolo-installed-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ -n "${KOLO_WHEEL_CHECK_PIP_CACHE:-}" ]; then
  export PIP_CACHE_DIR="$KOLO_WHEEL_CHECK_PIP_CACHE"
  unset PIP_NO_CACHE_DIR
fi

step "fresh virtualenv in $work with $(basename "$wheel")[spark,torch]"
"$("$MAIN_PY" -c 'import sys; print(sys._base_executable)')" -m venv "$work/venv"
PY="$work/venv/bin/python"
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ "$lend" = 1 ]; then
  "$torch_py" "$REPO/dev/installed_wheel/borrow_torch.py" "$work/lent" >"$work/torch-requirements.txt"
  echo "$work/lent" >"$SITE/kolo_lent_torch.pth"
else
  : >"$work/torch-requirements.txt"
fi
PIP=("$PY" -m pip --disable-pip-version-check --quiet)
cp "$REPO/dev/installed_wheel/check_package_data.py" "$REPO/dev/installed_wheel/torch_job.py" \
  "$REPO/examples/spark_torch_estimator.py" "$work/"
# The package files first (the wheel alone, seconds): a missing one fails before the downloads.
case "$wheel" in *.tar.gz) step "building $(basename "$wheel") from source (pip install)" ;; esac
"${PIP[@]}" install --no-deps "$wheel"
step "package files"
(cd "$work" && env -u PYTHONPATH "$PY" check_package_data.py "$REPO")

step "kolo's dependencies and the spark and torch extras"
# The suite's pins as constraints (extras dropped: pip refuses them there): pip still installs
# only what the wheel's metadata asks for, at the versions the rest of the suite tests.
if [ -n "$constraints" ]; then
  cp "$constraints" "$work/constraints.txt"
else
  sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$REPO/dev/requirements.txt" >"$work/constraints.txt"
fi
# scikit-learn: the example's own dependency (its digits data set), not kolo's.
"${PIP[@]}" install -c "$work/constraints.txt" "$requested" \
  -r "$work/torch-requirements.txt" scikit-learn
"${PIP[@]}" check

# Everything below runs from $work with the fresh venv first on PATH and no PYTHONPATH.
cd "$work"
for name in $(compgen -e | grep '^KOLO_' | grep -vx KOLO_LOG_LEVEL || true); do unset "$name"; done
run() { env -u PYTHONPATH PATH="$work/venv/bin:$PATH" PYTHONUNBUFFERED=1 "$@"; }

step "kolorun --check-build"
run kolorun --check-build | tee "$work/check-build.txt"
grep -q '\[X\] PyTorch' "$work/check-build.txt" || { echo "--check-build: PyTorch not found" >&2; exit 1; }

step "2-rank kolo.torch job"
run kolorun -np 2 python torch_job.py | tee "$work/torch-job.txt"
grep -q '\[0\]<stdout>:RESULT ok' "$work/torch-job.txt" || { echo "the 2-rank job did not finish" >&2; exit 1; }

step "the main job: examples/spark_torch_estimator.py"
run python spark_torch_estimator.py 2>&1 | tee "$work/example.txt" | grep -E "accuracy|Error" || true
accuracy=$(sed -n 's/^test accuracy: \([0-9.]*\)$/\1/p' "$work/example.txt")
[ -n "$accuracy" ] || { tail -40 "$work/example.txt" >&2; echo "the example printed no test accuracy" >&2; exit 1; }
# The suite's only run of the README's main job (pytest runs it through Spark Connect): all 15
# epochs trained, and at least 90 % test accuracy.
grep -q "^fit: .*, 15 epochs," "$work/example.txt" || { echo "the example did not train 15 epochs" >&2; exit 1; }
python3 -c "import sys; a = float(sys.argv[1]); sys.exit(0 if a >= 0.9 else f'accuracy {a} < 0.9')" "$accuracy"

step "passed"
