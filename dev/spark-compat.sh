#!/usr/bin/env bash
# Runs the Spark suites (kolo.spark.run and the TorchEstimator) against other PySpark releases
# than the one in dev/requirements.txt: each version is pip-installed into its own folder
# under ~/.cache/kolo-spark-compat and put first on PYTHONPATH (Spark's Python workers and
# the rank processes inherit it). Not part of dev/test.sh (each version is a ~450 MB download).
#   dev/spark-compat.sh 3.5.7 4.0.1
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- 3.5.7 4.0.1
cache="${KOLO_SPARK_COMPAT_CACHE:-$HOME/.cache/kolo-spark-compat}"
for version in "$@"; do
  target="$cache/pyspark-$version"
  if [ ! -d "$target/pyspark" ]; then
    echo "== installing pyspark $version into $target"
    .venv/bin/python -m pip install --quiet --no-deps --target "$target" "pyspark==$version"
  fi
  echo "== Spark suites on pyspark $version"
  PYTHONPATH="$target" .venv/bin/python -m pytest -q -p no:cacheprovider \
    tests/test_spark_run.py tests/test_spark_estimator.py tests/test_spark_inference.py
  echo "== the main job (examples/spark_torch_estimator.py) on pyspark $version"
  PYTHONPATH="$target" .venv/bin/python examples/spark_torch_estimator.py
done
