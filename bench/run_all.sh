#!/usr/bin/env bash
# Runs the whole benchmark suite and prints its figures; JSON goes to bench/results/.
#
#   bench/run_all.sh --quick   # < 5 min on a 2-core machine: tiny sizes and short timings
#   bench/run_all.sh --full    # the full size ranges (8 B ... 256 MiB, 64 KiB ... 512 MiB)
#
# KOLO_TRANSPORT is passed through to every rank (collectives.py also forces tcp itself for
# its kolo[tcp] column); RANKS (default 2) sets the job size of the multi-rank scripts. Where
# bench/peers/horovod.sh built Horovod 0.28.1's venv, collectives, training and elastic measure
# it too, interleaved (--horovod auto).
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:---quick}"
case "$mode" in
  --quick) quick=(--quick) ;;
  --full) quick=() ;;
  *) echo "usage: bench/run_all.sh [--quick|--full]" >&2; exit 2 ;;
esac
ranks="${RANKS:-2}"
bin="$PWD/.venv/bin"
[ -x "$bin/kolorun" ] || { echo "bench/run_all.sh: run ./dev/setup.sh first" >&2; exit 1; }
export PATH="$bin:$PATH" PYTHONUNBUFFERED=1
[ -n "${KOLO_TRANSPORT:-}" ] && export KOLO_TRANSPORT

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
start=$(date +%s)

# kolorun prefixes rank output with "[r]<stdout>:"; show rank 0's figures and everyone's errors.
figures() { sed -n -e 's/^\[0\]<stdout>://p' -e '/^\[[0-9]*\]<stderr>:/p'; }

echo "== calibrate"
python bench/calibrate.py "${quick[@]}"
echo "== collectives ($ranks ranks; kolo with KOLO_TRANSPORT=auto and tcp vs gloo)"
kolorun -np "$ranks" python bench/collectives.py "${quick[@]}" | figures
echo "== fusion (ResNet-50 gradients)"
kolorun -np "$ranks" python bench/fusion.py "${quick[@]}" | figures
echo "== shared-memory stores (ordinary, streaming, auto)"
kolorun -np "$ranks" python bench/shm_stores.py "${quick[@]}" | figures
echo "== training (1 rank, then $ranks)"
kolorun -np 1 python bench/training.py "${quick[@]}" --horovod no --json "$scratch/one.json" |
  figures
kolorun -np "$ranks" python bench/training.py "${quick[@]}" \
  --single-rank-json "$scratch/one.json" | figures
echo "== elastic (kill and add -> first step; commit vs memcpy)"
python bench/elastic.py "${quick[@]}"
echo "== done in $(( $(date +%s) - start )) s"
