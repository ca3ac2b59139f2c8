package io.kolo.spark;

import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.SparkPlugin;

/**
 * kolo's Spark plugin ({@code spark.plugins=io.kolo.spark.KoloSparkPlugin}): on the driver it
 * attaches {@link KoloSparkListener} and puts what executors report into {@link
 * KoloEventQueue#driver()}; on each executor it reports what only the executor sees (its pid
 * and host at start, a notice when it shuts down gracefully).
 */
public class KoloSparkPlugin implements SparkPlugin {
  /** The plugin (Spark instantiates it by class name). */
  public KoloSparkPlugin() {}

  @Override
  public DriverPlugin driverPlugin() {
    return new KoloDriverPlugin(KoloEventQueue.driver());
  }

  @Override
  public ExecutorPlugin executorPlugin() {
    return new KoloExecutorPlugin();
  }
}
