package io.kolo.spark;

import org.apache.spark.SparkContext;

/**
 * What kolo's Python driver calls over py4j ({@code sc._jvm.io.kolo.spark.KoloEvents}): attach
 * the listener, drain the driver's queue, read its counters.
 */
public final class KoloEvents {
  private KoloEvents() {}

  /** The plugin's version (the Maven project's). */
  public static final String VERSION = "0.1.0";

  /** Attaches {@link KoloSparkListener} to {@code sc} unless it has one; true if it added one. */
  public static boolean attach(SparkContext sc) {
    return KoloSparkListener.attach(sc);
  }

  /** Up to {@code max} of the oldest events, one JSON object a line ("" when none). */
  public static String drain(int max) {
    return KoloEventQueue.driver().drainLines(max);
  }

  /** How many events the driver's queue dropped because it was full. */
  public static long dropped() {
    return KoloEventQueue.driver().dropped();
  }

  /** The driver queue's capacity. */
  public static int capacity() {
    return KoloEventQueue.driver().capacity();
  }
}
