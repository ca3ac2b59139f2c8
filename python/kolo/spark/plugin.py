"""kolo's Spark plugin (the ``jvm/`` jar shipped in the wheel): where it is, and how to add it to
a ``SparkSession``.

With the plugin on the driver, ``kolo.spark.run`` and the estimators' ``fit`` fail as soon as
Spark is told that an executor running one of their tasks was lost, with the executor, its host
and the cluster manager's reason (e.g. ``Command exited with code 137`` for an OOM kill), and
``kolo.spark.run_elastic`` logs executors added and removed as discovery events. Without it
everything works as before (the heartbeat path notices lost executors). See docs/spark.md.

Example::

    from pyspark.sql import SparkSession
    import kolo.spark.plugin

    spark = kolo.spark.plugin.configure(SparkSession.builder).getOrCreate()
"""

from __future__ import annotations

import os
from typing import Any, Optional

__all__ = ["LISTENER_CLASS", "PLUGIN_CLASS", "configure", "jar_path"]

#: The plugin's ``spark.plugins`` class (its driver side attaches the listener too).
PLUGIN_CLASS = "io.kolo.spark.KoloSparkPlugin"
#: The listener's ``spark.extraListeners`` class (driver-side events only, no executor reports).
LISTENER_CLASS = "io.kolo.spark.KoloSparkListener"

_JAR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jars", "kolo-spark.jar")


def jar_path() -> Optional[str]:
    """The path of the plugin's jar in this kolo installation, or None when it was built
    without it (no Maven at build time).

    Example::

        import kolo.spark

        print(kolo.spark.jar_path())  # .../kolo/spark/jars/kolo-spark.jar
    """
    return _JAR if os.path.isfile(_JAR) else None


def configure(builder: Any) -> Any:
    """Adds the plugin to a ``SparkSession.Builder`` (before its ``getOrCreate``): the jar to
    ``spark.jars`` and ``spark.driver.extraClassPath``, and :data:`PLUGIN_CLASS` to
    ``spark.plugins``, keeping values already set there. Returns the builder; unchanged (and a
    warning logged) when the jar is missing. Set it up before the first session of the process:
    a running driver JVM does not take new jars on its classpath.

    Example::

        from pyspark.sql import SparkSession
        import kolo.spark.plugin

        spark = kolo.spark.plugin.configure(SparkSession.builder.master("local[2]")).getOrCreate()
    """
    jar = jar_path()
    if jar is None:
        import logging

        logging.getLogger("kolo.spark").warning(
            "kolo.spark.plugin.configure: this kolo was built without its Spark plugin jar "
            "(build it with dev/build-jvm.sh); continuing without it"
        )
        return builder
    options = getattr(builder, "_options", {}) or {}
    for key, value, separator in (
        ("spark.jars", jar, ","),
        ("spark.driver.extraClassPath", jar, os.pathsep),
        ("spark.plugins", PLUGIN_CLASS, ","),
    ):
        current = str(options.get(key, "") or "")
        if value not in current.split(separator):
            builder = builder.config(key, f"{current}{separator}{value}" if current else value)
    return builder
