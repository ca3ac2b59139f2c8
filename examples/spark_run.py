"""The Horovod docs' ``horovod.spark.run`` toy on kolo: every rank prints and returns its rank,
local rank and size. Runs offline on a local[2] Spark session:

    .venv/bin/python examples/spark_run.py
"""

import os
import sys

from pyspark.sql import SparkSession

import kolo.spark


def fn(magic_number):
    import kolo.torch as hvd

    hvd.init()
    print(
        f"Hello, rank = {hvd.rank()}, local_rank = {hvd.local_rank()}, size = {hvd.size()}, "
        f"magic_number = {magic_number}"
    )
    return hvd.rank(), hvd.local_rank(), hvd.size()


def main() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kolo-spark-run-example")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        results = kolo.spark.run(fn, args=(42,))
        print("results (rank, local_rank, size) by rank:", results)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
