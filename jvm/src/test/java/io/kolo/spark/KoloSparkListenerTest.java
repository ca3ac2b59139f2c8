package io.kolo.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import java.util.stream.Collectors;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkException;
import org.apache.spark.api.java.JavaSparkContext;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The listener and plugin inside a real local[2] SparkContext in this JVM. */
class KoloSparkListenerTest {
  private static JavaSparkContext jsc;
  /** What the queue held once the context started (the plugin's start reports). */
  private static List<String> startEvents;

  @BeforeAll
  static void startSpark() {
    SparkConf conf =
        new SparkConf()
            .setMaster("local[2]")
            .setAppName("kolo-jvm-tests")
            .set("spark.ui.enabled", "false")
            .set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.plugins", KoloSparkPlugin.class.getName());
    KoloEventQueue.driver().drain(Integer.MAX_VALUE);
    jsc = new JavaSparkContext(conf);
    String pid = "\"pid\":" + ProcessHandle.current().pid();
    try {
      startEvents =
          eventsUntil(e -> e.startsWith("{\"kind\":\"executorStarted\"") && e.contains(pid));
    } catch (AssertionError | InterruptedException error) {
      startEvents = List.of(error.toString());
    }
  }

  @AfterAll
  static void stopSpark() {
    if (jsc != null) {
      jsc.stop();
    }
  }

  /** Drains the driver queue until an event matching {@code done} arrives (or 20 s pass). */
  private static List<String> eventsUntil(Predicate<String> done) throws InterruptedException {
    List<String> seen = new ArrayList<>();
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
    while (System.nanoTime() < deadline) {
      List<String> batch = KoloEventQueue.driver().drain(1000);
      seen.addAll(batch);
      if (batch.stream().anyMatch(done)) {
        return seen;
      }
      Thread.sleep(20);
    }
    throw new AssertionError("no matching event within 20 s; saw:\n" + String.join("\n", seen));
  }

  @Test
  void thePluginAttachedTheListenerOnceAndTheExecutorReportedItsPid() throws Exception {
    assertFalse(KoloEvents.attach(jsc.sc()), "the plugin attached a listener already");
    // The plugin's executor side runs in the local executor: a report with this JVM's pid.
    String pid = "\"pid\":" + ProcessHandle.current().pid();
    assertTrue(
        startEvents.stream()
            .anyMatch(
                e ->
                    e.startsWith("{\"kind\":\"executorStarted\"")
                        && e.contains(pid)
                        && e.contains("\"executorId\":\"driver\"")),
        startEvents.toString());
  }

  @Test
  void aFailingTaskOfAKoloJobIsReportedWithItsExceptionAndExecutor() throws Exception {
    KoloEventQueue.driver().drain(Integer.MAX_VALUE);
    jsc.setJobGroup("kolo.test-failing", "a job whose task fails", false);
    try {
      SparkException error =
          assertThrows(
              SparkException.class,
              () ->
                  jsc.parallelize(List.of(1, 2), 2)
                      .map(
                          x -> {
                            if (x == 2) {
                              throw new IllegalStateException("kolo-boom-" + x);
                            }
                            return x;
                          })
                      .collect());
      assertTrue(error.getMessage().contains("kolo-boom-2"), error.getMessage());
    } finally {
      jsc.clearJobGroup();
    }
    String group = "\"group\":\"kolo.test-failing\"";
    List<String> events =
        eventsUntil(e -> e.contains("\"kind\":\"taskFailed\"") && e.contains(group));
    List<String> starts =
        events.stream()
            .filter(e -> e.contains("\"kind\":\"taskStart\"") && e.contains(group))
            .collect(Collectors.toList());
    assertEquals(2, starts.size(), events.toString());
    String failed =
        events.stream()
            .filter(e -> e.contains("\"kind\":\"taskFailed\"") && e.contains(group))
            .findFirst()
            .get();
    assertTrue(failed.contains("\"failure\":\"ExceptionFailure\""), failed);
    assertTrue(failed.contains("kolo-boom-2"), failed);
    assertTrue(failed.contains("\"partition\":1"), failed);
    assertTrue(failed.contains("\"executorId\":\"driver\""), failed);
    assertTrue(failed.contains("\"group\":\"kolo.test-failing\""), failed);
  }

  @Test
  void tasksOfOtherJobGroupsAreNotTrackedButTheirFailuresAre() throws Exception {
    KoloEventQueue.driver().drain(Integer.MAX_VALUE);
    assertThrows(
        SparkException.class,
        () ->
            jsc.parallelize(List.of(1), 1)
                .map(
                    x -> {
                      throw new IllegalArgumentException("not-kolo");
                    })
                .collect());
    List<String> events = eventsUntil(e -> e.contains("not-kolo"));
    assertFalse(events.stream().anyMatch(e -> e.contains("\"kind\":\"taskStart\"")), events.toString());
    assertTrue(events.stream().anyMatch(e -> e.contains("\"group\":null")), events.toString());
  }

  @Test
  void cancellingAKoloJobReportsItsTasksKilled() throws Exception {
    KoloEventQueue.driver().drain(Integer.MAX_VALUE);
    Thread job =
        new Thread(
            () -> {
              jsc.setJobGroup("kolo.test-cancel", "a job that is cancelled", true);
              try {
                jsc.parallelize(List.of(1, 2), 2)
                    .map(
                        x -> {
                          Thread.sleep(60_000);
                          return x;
                        })
                    .collect();
              } catch (Exception expected) {
                // cancelled
              }
            });
    job.start();
    List<String> seen = new ArrayList<>();
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
    while (seen.stream().filter(e -> e.contains("\"kind\":\"taskStart\"")).count() < 2
        && System.nanoTime() < deadline) {
      seen.addAll(KoloEventQueue.driver().drain(1000));
      Thread.sleep(20);
    }
    jsc.cancelJobGroup("kolo.test-cancel");
    // Killed after the job ended, the tasks still carry their kolo job group.
    List<String> events =
        eventsUntil(
            e ->
                e.contains("\"failure\":\"TaskKilled\"")
                    && e.contains("\"group\":\"kolo.test-cancel\""));
    job.join(20_000);
    assertFalse(job.isAlive());
    assertTrue(events.stream().anyMatch(e -> e.contains("cancelled job group kolo.test-cancel")));
  }
}
