package io.kolo.spark;

import java.util.Collections;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.spark.SparkContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.PluginContext;

/**
 * The driver side of {@link KoloSparkPlugin}: attaches {@link KoloSparkListener} and queues the
 * executors' reports. A report must be one line of JSON object text of at most {@link
 * #MAX_REPORT_CHARS} characters; anything else is counted in {@link #rejected()} and dropped.
 */
public class KoloDriverPlugin implements DriverPlugin {
  /** The longest report from an executor the driver queues. */
  public static final int MAX_REPORT_CHARS = 8192;

  private final KoloEventQueue queue;
  private final AtomicLong rejected = new AtomicLong();

  /** A driver plugin queueing into {@code queue}. */
  public KoloDriverPlugin(KoloEventQueue queue) {
    this.queue = queue;
  }

  @Override
  public Map<String, String> init(SparkContext sc, PluginContext pluginContext) {
    KoloSparkListener.attach(sc);
    return Collections.emptyMap();
  }

  @Override
  public Object receive(Object message) {
    if (message instanceof String report
        && report.length() <= MAX_REPORT_CHARS
        && report.startsWith("{\"kind\":\"executor")
        && report.endsWith("}")
        && report.indexOf('\n') < 0) {
      queue.offer(report);
    } else {
      rejected.incrementAndGet();
    }
    return null;
  }

  /** How many executor messages were not queued (not a bounded one-line JSON report). */
  public long rejected() {
    return rejected.get();
  }
}
