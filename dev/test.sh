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
stage "the wheel as users install it (dev/build-wheel.sh reuses the build; dev/test-installed-wheel.sh)"
dev/build-wheel.sh .whl
dev/test-installed-wheel.sh .whl/kolo-*.whl
stage "pytest"
# The slowest tests, so a run that grows past CI's budget shows where the time went.
python -m pytest --durations=30
echo "== test suite passed in $(( $(date +%s) - start )) s"
