#!/usr/bin/env bash
# Builds kolo's wheel from the build dev/setup.sh's `maturin develop --release` made, splits its
# debug info out (dev/split_debuginfo.py) and leaves both in OUT_DIR (default .whl/):
#   OUT_DIR/kolo-<version>-cp39-abi3-<platform>.whl          the lean wheel
#   OUT_DIR/kolo-<version>-cp39-abi3-<platform>.debug/...     its native module's debug info
# `maturin build` runs cargo with the same profile, features and PyO3 environment as `maturin
# develop` (PYO3_PYTHON is the interpreter given with -i, so it is .venv's python, as develop's
# is), so cargo finds every crate fresh and this only packs and strips: CI compiles kolo once.
# The wheel is tagged for this machine's glibc; dev/build-release.sh makes the portable
# (manylinux2014) release wheels. dev/test.sh runs this, then dev/test-installed-wheel.sh.
#
# Usage: dev/build-wheel.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.whl}
mkdir -p "$out"
rm -rf "$out"/kolo-*.whl "$out"/kolo-*.debug
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" .venv/bin/maturin build --release --quiet \
  -i "$PWD/.venv/bin/python" --out "$out"
.venv/bin/python dev/split_debuginfo.py "$out"/kolo-*.whl
