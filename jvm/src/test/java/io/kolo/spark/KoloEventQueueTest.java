package io.kolo.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import org.apache.spark.scheduler.SparkListenerExecutorRemoved;
import org.junit.jupiter.api.Test;

class KoloEventQueueTest {
  @Test
  void fullQueueDropsTheOldestAndCountsThem() {
    KoloEventQueue queue = new KoloEventQueue(3);
    for (int i = 0; i < 5; i++) {
      queue.offer("e" + i);
    }
    assertEquals(2, queue.dropped());
    assertEquals(5, queue.offered());
    assertEquals(List.of("e2", "e3", "e4"), queue.drain(10));
    assertEquals(0, queue.size());
    assertEquals("", queue.drainLines(10));
  }

  @Test
  void drainTakesAtMostMaxInOrder() {
    KoloEventQueue queue = new KoloEventQueue(10);
    queue.offer("a");
    queue.offer("b");
    queue.offer("c");
    assertEquals("a\nb", queue.drainLines(2));
    assertEquals("c", queue.drainLines(2));
    assertEquals(List.of(), queue.drain(-1));
  }

  @Test
  void capacityMustBePositive() {
    assertThrows(IllegalArgumentException.class, () -> new KoloEventQueue(0));
  }

  @Test
  void theListenerNeverBlocksOnAFullQueueThatNobodyDrains() {
    KoloEventQueue queue = new KoloEventQueue(16);
    KoloSparkListener listener = new KoloSparkListener(queue);
    // 200k removals with no consumer: each call returns at once (drop-oldest), none waits.
    assertTimeoutPreemptively(
        Duration.ofSeconds(20),
        () -> {
          for (int i = 0; i < 200_000; i++) {
            listener.onExecutorRemoved(new SparkListenerExecutorRemoved(i, "exec-" + i, "lost"));
          }
        });
    assertEquals(16, queue.size());
    assertEquals(200_000 - 16, queue.dropped());
    List<String> kept = queue.drain(100);
    assertTrue(kept.get(15).contains("\"executorId\":\"exec-199999\""), kept.get(15));
  }

  @Test
  void concurrentProducersNeverBlockAndNothingIsLostUncounted() throws Exception {
    KoloEventQueue queue = new KoloEventQueue(64);
    Thread[] producers = new Thread[4];
    for (int p = 0; p < producers.length; p++) {
      producers[p] =
          new Thread(
              () -> {
                for (int i = 0; i < 50_000; i++) {
                  queue.offer("x");
                }
              });
      producers[p].start();
    }
    for (Thread producer : producers) {
      producer.join(20_000);
      assertFalse(producer.isAlive(), "a producer blocked on the full queue");
    }
    assertEquals(200_000, queue.offered());
    assertEquals(200_000, queue.dropped() + queue.size());
  }

  @Test
  void eventsAreOneLineOfEscapedJson() {
    String json =
        KoloEvent.of("executorRemoved")
            .put("executorId", "7")
            .put("reason", "Command exited with code 137\n\"OOM\"\t\u0001")
            .put("host", (String) null)
            .put("exitCausedByApp", true)
            .toJson();
    assertFalse(json.contains("\n"), json);
    assertTrue(json.startsWith("{\"kind\":\"executorRemoved\",\"time\":"), json);
    assertTrue(
        json.endsWith(
            ",\"executorId\":\"7\",\"reason\":\"Command exited with code 137\\n\\\"OOM\\\"\\t"
                + "\\u0001\",\"host\":null,\"exitCausedByApp\":true}"),
        json);
  }

  @Test
  void longFieldsAreCut() {
    String json = KoloEvent.of("k").put("reason", "r".repeat(10_000)).toJson();
    assertTrue(json.length() < KoloEvent.MAX_FIELD_CHARS + 100, "length " + json.length());
    assertTrue(json.endsWith("...\"}"), json.substring(json.length() - 10));
  }

  @Test
  void theDriverPluginQueuesOnlyBoundedOneLineExecutorReports() {
    KoloEventQueue queue = new KoloEventQueue(10);
    KoloDriverPlugin plugin = new KoloDriverPlugin(queue);
    String report = KoloEvent.of("executorStarted").put("executorId", "1").toJson();
    plugin.receive(report);
    plugin.receive(42);
    plugin.receive("{\"kind\":\"taskFailed\"}");
    plugin.receive("{\"kind\":\"executorStarted\"}\n{\"kind\":\"executorRemoved\"}");
    plugin.receive(
        "{\"kind\":\"executorStarted\",\"x\":\""
            + "y".repeat(KoloDriverPlugin.MAX_REPORT_CHARS)
            + "\"}");
    assertEquals(List.of(report), queue.drain(10));
    assertEquals(4, plugin.rejected());
  }
}
