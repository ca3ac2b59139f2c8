#!/usr/bin/env bash
# Sets everything up and runs the main job: a Spark DataFrame trained on by kolo's
# TorchEstimator on 2 ranks (local Spark), then TorchModel.transform on held-out rows.
set -euo pipefail
cd "$(dirname "$0")/.."
dev/system-deps.sh
dev/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
exec python examples/spark_torch_estimator.py
