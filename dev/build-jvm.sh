#!/usr/bin/env bash
# Builds kolo's Spark plugin (jvm/, Maven) against the installed PySpark's jars and copies it to
# python/kolo/spark/jars/kolo-spark.jar, where the wheel and kolo.spark.jar_path() find it.
#   dev/build-jvm.sh          build and run the JUnit tests (a local[2] SparkContext)
#   dev/build-jvm.sh --skip-tests
# Needs mvn, a JDK 17+ and PySpark in $PYTHON (default: .venv/bin/python, else python3).
# Maven's local repository: $KOLO_MAVEN_REPO (default ~/.m2/repository; CI keeps it in its cache).
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin="${PYTHON:-}"
if [ -z "$python_bin" ]; then
  if [ -x .venv/bin/python ]; then python_bin=.venv/bin/python; else python_bin=python3; fi
fi
command -v mvn >/dev/null 2>&1 || { echo "dev/build-jvm.sh: mvn not found (apt-get install maven)" >&2; exit 1; }
read -r spark_version jars_dir < <("$python_bin" -c '
import os, pyspark
print(pyspark.__version__, os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
scala_jar=$(cd "$jars_dir" && ls scala-library-2.13.*.jar | head -1)
scala_version=${scala_jar#scala-library-}
scala_version=${scala_version%.jar}
args=(-B -ntp -f jvm/pom.xml "-Dspark.version=$spark_version" "-Dspark.jars.dir=$jars_dir"
      "-Dscala.library.version=$scala_version")
if [ -n "${KOLO_MAVEN_REPO:-}" ]; then args+=("-Dmaven.repo.local=$KOLO_MAVEN_REPO"); fi
if [ "${1:-}" = "--skip-tests" ]; then
  args+=(-DskipTests)
else
  args+=("-Dmaven.test.additionalClasspath=$(ls "$jars_dir"/*.jar | paste -sd, -)")
fi
echo "== building the kolo Spark plugin (jvm/, Spark $spark_version)"
mvn "${args[@]}" package
mkdir -p python/kolo/spark/jars
cp jvm/target/kolo-spark.jar python/kolo/spark/jars/kolo-spark.jar
