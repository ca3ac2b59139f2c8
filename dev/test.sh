#!/usr/bin/env bash
# Sets everything up and runs the whole test suite: formatting and lints, the Rust tests, then
# the Python end-to-end suite (real processes, kolorun, ssh to 127.0.0.1). CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Each stage's heading says how long the run has taken so far (CI keeps the log of a failed run).
stage() { echo "== [$(( $(date +%s) - start )) s] $*"; }
dev/system-deps.sh --tests
# The Rust test binaries compile while dev/setup.sh downloads and unpacks the Python packages
# (a couple of minutes, mostly waiting on the network); their log is shown when the Rust tests
# run. cargo's lock on the target dir makes setup's own kolo build wait for this one rather than
# race it.
rust_tests=(cargo test --release --workspace --locked --features kolo-collective/cuda)
rust_build_log=$(mktemp)
"${rust_tests[@]}" --no-run >"$rust_build_log" 2>&1 &
rust_build=$!
trap 'kill "$rust_build" 2>/dev/null || true; rm -f "$rust_build_log"' EXIT
stage "dev/setup.sh (the Rust test binaries build meanwhile)"
dev/setup.sh
dev/emulators.sh
export PATH="$PWD/.venv/bin:$PATH"

stage "cargo fmt --check"
cargo fmt --all -- --check
# The wheel is built with the `cuda` feature (CUDA libraries load at run time; no toolkit), so
# lints and tests run with it too; one lint pass without it covers the no-CUDA stubs.
stage "cargo clippy (release, -D warnings; with and without the cuda feature)"
cargo clippy --release --workspace --all-targets --locked --features kolo-collective/cuda -- -D warnings
cargo clippy --release -p kolo-collective --lib --locked -- -D warnings
# The wheel check mostly waits on pip unpacking into a fresh venv, so it runs while the Rust
# tests and the JVM build run; its log is shown (and its status checked) before pytest starts.
stage "the wheel as users install it, in the background (dev/build-wheel.sh reuses the build)"
dev/build-wheel.sh .whl
wheel_check_log=$(mktemp)
dev/test-installed-wheel.sh .whl/kolo-*.whl >"$wheel_check_log" 2>&1 &
wheel_check=$!
trap 'kill "$rust_build" "$wheel_check" 2>/dev/null || true; rm -f "$rust_build_log" "$wheel_check_log"' EXIT
stage "cargo test (release, cuda feature)"
rust_build_status=0
wait "$rust_build" || rust_build_status=$?
cat "$rust_build_log"
[ "$rust_build_status" = 0 ] || { echo "the Rust test build failed" >&2; exit "$rust_build_status"; }
"${rust_tests[@]}"
stage "ruff"
ruff format --check python tests examples bench
ruff check python tests examples bench
stage "kolo's Spark plugin: Maven build and JUnit tests (jvm/)"
PYTHON=.venv/bin/python dev/build-jvm.sh
stage "the wheel as users install it: waiting for dev/test-installed-wheel.sh"
wheel_check_status=0
wait "$wheel_check" || wheel_check_status=$?
cat "$wheel_check_log"
[ "$wheel_check_status" = 0 ] || { echo "the installed-wheel check failed" >&2; exit "$wheel_check_status"; }
stage "pytest, in two lanes at once: the cluster suites, and the rest (shown when it ends)"
# The suite's rank processes wait on timeouts for about a sixth of its time; the second lane fills
# those waits (tests/conftest.py's --lane: the Spark, Ray and storage-server suites in one, so each
# cluster starts once). Each lane lists its slowest tests, so a run that grows past CI's budget
# shows where the time went.
lanes_tmp=$(mktemp -d)
trap 'kill "$rust_build" "$wheel_check" "${lane:-}" 2>/dev/null || true; rm -rf "$rust_build_log" "$wheel_check_log" "$lanes_tmp"' EXIT
python -m pytest --lane processes --durations=15 --basetemp="$lanes_tmp/processes" \
  >"$lanes_tmp/processes.log" 2>&1 &
lane=$!
clusters_status=0
python -m pytest --lane clusters --durations=15 --basetemp="$lanes_tmp/clusters" || clusters_status=$?
processes_status=0
wait "$lane" || processes_status=$?
echo "== the processes lane's output"
cat "$lanes_tmp/processes.log"
[ "$clusters_status" = 0 ] || { echo "the clusters lane failed" >&2; exit "$clusters_status"; }
[ "$processes_status" = 0 ] || { echo "the processes lane failed" >&2; exit "$processes_status"; }
echo "== test suite passed in $(( $(date +%s) - start )) s"
