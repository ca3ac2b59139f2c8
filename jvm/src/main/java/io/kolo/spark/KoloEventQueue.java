package io.kolo.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A bounded queue of events (single-line JSON strings) that never blocks its producers: when it
 * is full, {@link #offer} drops the oldest event and counts the drop. Spark's listener bus and
 * the plugin's RPC thread put events in; kolo's Python driver takes them out with {@link
 * #drainLines} over py4j.
 */
public final class KoloEventQueue {
  /** How many events the driver's queue holds. */
  public static final int DEFAULT_CAPACITY = 4096;

  private static final KoloEventQueue DRIVER = new KoloEventQueue(DEFAULT_CAPACITY);

  private final int capacity;
  private final ArrayBlockingQueue<String> events;
  private final AtomicLong dropped = new AtomicLong();
  private final AtomicLong offered = new AtomicLong();

  /** A queue holding at most {@code capacity} events. */
  public KoloEventQueue(int capacity) {
    if (capacity <= 0) {
      throw new IllegalArgumentException("capacity must be positive, got " + capacity);
    }
    this.capacity = capacity;
    this.events = new ArrayBlockingQueue<>(capacity);
  }

  /** The driver JVM's one queue (shared by the listener and the driver plugin). */
  public static KoloEventQueue driver() {
    return DRIVER;
  }

  /** Adds an event without blocking, dropping (and counting) the oldest ones while full. */
  public void offer(String event) {
    offered.incrementAndGet();
    while (!events.offer(event)) {
      if (events.poll() != null) {
        dropped.incrementAndGet();
      }
    }
  }

  /** Adds an event without blocking (see {@link #offer(String)}). */
  public void offer(KoloEvent event) {
    offer(event.toJson());
  }

  /** Takes up to {@code max} of the oldest events, without waiting. */
  public List<String> drain(int max) {
    List<String> taken = new ArrayList<>(Math.min(Math.max(max, 0), capacity));
    events.drainTo(taken, Math.max(max, 0));
    return taken;
  }

  /**
   * Takes up to {@code max} of the oldest events, without waiting, as one string of lines (one
   * event a line; empty when there is none): one py4j call for a whole batch.
   */
  public String drainLines(int max) {
    return String.join("\n", drain(max));
  }

  /** How many events were dropped because the queue was full. */
  public long dropped() {
    return dropped.get();
  }

  /** How many events were offered in all. */
  public long offered() {
    return offered.get();
  }

  /** How many events wait to be drained. */
  public int size() {
    return events.size();
  }

  /** The most events the queue holds. */
  public int capacity() {
    return capacity;
  }
}
