#!/usr/bin/env bash
# Sets everything up and runs the whole test suite: formatting and lints, the Rust tests, then
# the Python end-to-end suite (real processes, kolorun, ssh to 127.0.0.1). CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Each stage's heading says how long the run has taken so far (CI keeps the log of a failed run).
stage() { echo "== [$(( $(date +%s) - start )) s] $*"; }
# Steps that mostly wait (on the network, on pip unpacking, on timeouts) run in the background
# beside the ones that compute: `background NAME CMD...` starts one with its output in a log,
# `finish NAME` waits for it, shows that log and fails the run if the step failed.
logs=$(mktemp -d)
declare -A pids=()
background() {
  local name=$1
  shift
  "$@" >"$logs/$name.log" 2>&1 &
  pids[$name]=$!
}
finish() {
  local status=0
  wait "${pids[$1]}" || status=$?
  unset "pids[$1]"
  cat "$logs/$1.log"
  [ "$status" = 0 ] || { echo "$1 failed" >&2; exit "$status"; }
}
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$logs"' EXIT
dev/system-deps.sh --tests
# The Rust test binaries compile, and the storage emulators install, while dev/setup.sh downloads
# and unpacks the Python packages (a couple of minutes, mostly waiting on the network). cargo's
# lock on the target dir makes setup's own kolo build wait for this one rather than race it.
rust_tests=(cargo test --release --workspace --locked --features kolo-collective/cuda)
background rust-test-build "${rust_tests[@]}" --no-run
background emulators dev/emulators.sh
stage "dev/setup.sh (the Rust test binaries build and the emulators install meanwhile)"
dev/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

# The wheel check mostly waits on pip unpacking into a fresh venv, so it runs while the lints,
# the Rust tests and the JVM build run; its log is shown before pytest starts.
stage "the wheel as users install it, in the background (dev/build-wheel.sh reuses the build)"
dev/build-wheel.sh .whl
background wheel-check dev/test-installed-wheel.sh .whl/kolo-*.whl
stage "cargo fmt --check"
cargo fmt --all -- --check
# The wheel is built with the `cuda` feature (CUDA libraries load at run time; no toolkit), so
# lints and tests run with it too; one lint pass without it covers the no-CUDA stubs.
stage "cargo clippy (release, -D warnings; with and without the cuda feature)"
cargo clippy --release --workspace --all-targets --locked --features kolo-collective/cuda -- -D warnings
cargo clippy --release -p kolo-collective --lib --locked -- -D warnings
stage "cargo test (release, cuda feature)"
finish rust-test-build
"${rust_tests[@]}"
stage "ruff"
ruff format --check python tests examples bench
ruff check python tests examples bench
stage "kolo's Spark plugin: Maven build and JUnit tests (jvm/)"
PYTHON=.venv/bin/python dev/build-jvm.sh
stage "the storage emulators: waiting for dev/emulators.sh"
finish emulators
stage "the wheel as users install it: waiting for dev/test-installed-wheel.sh"
finish wheel-check
stage "pytest, in two lanes at once: the cluster suites, and the rest (shown when it ends)"
# The suite's rank processes wait on timeouts for about a sixth of its time; the second lane fills
# those waits (tests/conftest.py's --lane: the Spark, Ray and storage-server suites in one, so each
# cluster starts once). Each lane lists its slowest tests, so a run that grows past CI's budget
# shows where the time went.
background processes-lane python -m pytest --lane processes --durations=15 \
  --basetemp="$logs/processes"
clusters_status=0
python -m pytest --lane clusters --durations=15 --basetemp="$logs/clusters" || clusters_status=$?
echo "== the processes lane's output"
finish processes-lane
[ "$clusters_status" = 0 ] || { echo "the clusters lane failed" >&2; exit "$clusters_status"; }
echo "== test suite passed in $(( $(date +%s) - start )) s"
