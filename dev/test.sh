#!/usr/bin/env bash
# Sets everything up and runs the whole test suite: formatting and lints, the Rust tests, then
# the Python end-to-end suite (real processes, kolorun, ssh to 127.0.0.1). CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
dev/system-deps.sh --tests
dev/setup.sh
dev/emulators.sh
export PATH="$PWD/.venv/bin:$PATH"
# Each stage's heading says how long the run has taken so far (CI keeps the log of a failed run).
stage() { echo "== [$(( $(date +%s) - start )) s] $*"; }

stage "cargo fmt --check"
cargo fmt --all -- --check
# The wheel is built with the `cuda` feature (CUDA libraries load at run time; no toolkit), so
# lints and tests run with it too; one lint pass without it covers the no-CUDA stubs.
stage "cargo clippy (release, -D warnings; with and without the cuda feature)"
cargo clippy --release --workspace --all-targets --locked --features kolo-collective/cuda -- -D warnings
cargo clippy --release -p kolo-collective --lib --locked -- -D warnings
stage "cargo test (release, cuda feature)"
cargo test --release --workspace --locked --features kolo-collective/cuda
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
