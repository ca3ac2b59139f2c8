#!/usr/bin/env bash
# Sets everything up and runs the main job: 2 ranks training a classifier with kolo.
set -euo pipefail
cd "$(dirname "$0")/.."
dev/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
exec kolorun -np 2 python examples/torch_digits.py
