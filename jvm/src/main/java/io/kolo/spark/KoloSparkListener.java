package io.kolo.spark;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.ExceptionFailure;
import org.apache.spark.ExecutorLostFailure;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.TaskEndReason;
import org.apache.spark.TaskFailedReason;
import org.apache.spark.TaskKilled;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerExecutorAdded;
import org.apache.spark.scheduler.SparkListenerExecutorExcluded;
import org.apache.spark.scheduler.SparkListenerExecutorRemoved;
import org.apache.spark.scheduler.SparkListenerExecutorUnexcluded;
import org.apache.spark.scheduler.SparkListenerJobStart;
import org.apache.spark.scheduler.SparkListenerNodeExcluded;
import org.apache.spark.scheduler.SparkListenerNodeUnexcluded;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.apache.spark.scheduler.SparkListenerTaskStart;
import org.apache.spark.scheduler.TaskInfo;
import org.apache.spark.status.api.v1.ExecutorSummary;
import scala.reflect.ClassTag$;

/**
 * Records what the cluster manager tells Spark's driver, for kolo, into {@link
 * KoloEventQueue#driver()}:
 *
 * <ul>
 *   <li>{@code executorAdded} (executorId, host, cores), {@code executorRemoved} (executorId,
 *       host, Spark's reason text), {@code executorExcluded} / {@code executorUnexcluded},
 *       {@code nodeExcluded} / {@code nodeUnexcluded};
 *   <li>{@code taskFailed} for every task end whose reason is {@code ExecutorLostFailure},
 *       {@code TaskKilled} or {@code ExceptionFailure} (stage, task, partition, attempt,
 *       executor, host, reason);
 *   <li>{@code taskStart} for the tasks of jobs whose job group starts with {@code kolo.}
 *       (kolo's launches), so kolo knows which executor runs each of its tasks.
 * </ul>
 *
 * Every callback only builds a short string and offers it to a queue that never blocks, so the
 * listener never holds up Spark's listener bus. Register it with {@code
 * spark.extraListeners=io.kolo.spark.KoloSparkListener}, through {@link KoloSparkPlugin}, or
 * with {@link #attach(SparkContext)} (what kolo's Python driver calls).
 */
public class KoloSparkListener extends SparkListener {
  /** The job-group prefix whose tasks' starts are recorded (kolo's launches). */
  public static final String TRACKED_GROUP_PREFIX = "kolo.";

  /** How many stages of kolo jobs the listener remembers the job group of. */
  public static final int TRACKED_STAGES = 1024;

  private static final String JOB_GROUP_PROPERTY = "spark.jobGroup.id";

  private final KoloEventQueue queue;
  private final Map<String, String> executorHosts = new ConcurrentHashMap<>();
  /**
   * The job group of each recent stage of a kolo job (the newest {@link #TRACKED_STAGES}; kept
   * past the job's end, since the end events of its killed tasks come after it).
   */
  private final Map<Integer, String> stageGroups =
      Collections.synchronizedMap(
          new LinkedHashMap<>(16, 0.75f, false) {
            @Override
            protected boolean removeEldestEntry(Map.Entry<Integer, String> eldest) {
              return size() > TRACKED_STAGES;
            }
          });

  /** A listener writing to the driver's queue (the constructor Spark uses). */
  public KoloSparkListener() {
    this(KoloEventQueue.driver());
  }

  /** A listener writing to the driver's queue (for {@code spark.extraListeners}). */
  public KoloSparkListener(SparkConf conf) {
    this(KoloEventQueue.driver());
  }

  /** A listener writing to {@code queue}. */
  public KoloSparkListener(KoloEventQueue queue) {
    this.queue = queue;
  }

  /**
   * Adds a listener to {@code sc} unless one is there already (from {@code spark.extraListeners}
   * or the plugin); seeds it with the executors already registered. Returns whether it added
   * one.
   */
  public static synchronized boolean attach(SparkContext sc) {
    if (!sc.listenerBus().findListenersByClass(ClassTag$.MODULE$.apply(KoloSparkListener.class))
        .isEmpty()) {
      return false;
    }
    KoloSparkListener listener = new KoloSparkListener(KoloEventQueue.driver());
    listener.seedExecutors(sc);
    sc.addSparkListener(listener);
    return true;
  }

  /** The host of each executor this listener knows of, by executor id. */
  public Map<String, String> executorHosts() {
    return Map.copyOf(executorHosts);
  }

  private void seedExecutors(SparkContext sc) {
    try {
      scala.collection.Iterator<ExecutorSummary> executors =
          sc.statusStore().executorList(true).iterator();
      while (executors.hasNext()) {
        ExecutorSummary executor = executors.next();
        executorHosts.put(executor.id(), hostOf(executor.hostPort()));
      }
    } catch (RuntimeException error) {
      // The status store is Spark-internal: without it, hosts come from later events.
    }
  }

  private static String hostOf(String hostPort) {
    int colon = hostPort.lastIndexOf(':');
    return colon > 0 ? hostPort.substring(0, colon) : hostPort;
  }

  @Override
  public void onExecutorAdded(SparkListenerExecutorAdded event) {
    String host = event.executorInfo().executorHost();
    executorHosts.put(event.executorId(), host);
    queue.offer(
        KoloEvent.of("executorAdded")
            .put("executorId", event.executorId())
            .put("host", host)
            .put("cores", event.executorInfo().totalCores()));
  }

  @Override
  public void onExecutorRemoved(SparkListenerExecutorRemoved event) {
    String host = executorHosts.remove(event.executorId());
    queue.offer(
        KoloEvent.of("executorRemoved")
            .put("executorId", event.executorId())
            .put("host", host)
            .put("reason", event.reason()));
  }

  @Override
  public void onExecutorExcluded(SparkListenerExecutorExcluded event) {
    queue.offer(
        KoloEvent.of("executorExcluded")
            .put("executorId", event.executorId())
            .put("host", executorHosts.get(event.executorId()))
            .put("taskFailures", event.taskFailures()));
  }

  @Override
  public void onExecutorUnexcluded(SparkListenerExecutorUnexcluded event) {
    queue.offer(
        KoloEvent.of("executorUnexcluded")
            .put("executorId", event.executorId())
            .put("host", executorHosts.get(event.executorId())));
  }

  @Override
  public void onNodeExcluded(SparkListenerNodeExcluded event) {
    queue.offer(
        KoloEvent.of("nodeExcluded")
            .put("host", event.hostId())
            .put("executorFailures", event.executorFailures()));
  }

  @Override
  public void onNodeUnexcluded(SparkListenerNodeUnexcluded event) {
    queue.offer(KoloEvent.of("nodeUnexcluded").put("host", event.hostId()));
  }

  @Override
  public void onJobStart(SparkListenerJobStart event) {
    Properties properties = event.properties();
    String group = properties == null ? null : properties.getProperty(JOB_GROUP_PROPERTY);
    if (group == null || !group.startsWith(TRACKED_GROUP_PREFIX)) {
      return;
    }
    for (int i = 0; i < event.stageIds().size(); i++) {
      stageGroups.put((Integer) event.stageIds().apply(i), group);
    }
  }

  @Override
  public void onTaskStart(SparkListenerTaskStart event) {
    String group = stageGroups.get(event.stageId());
    if (group == null) {
      return;
    }
    TaskInfo info = event.taskInfo();
    queue.offer(
        task(KoloEvent.of("taskStart"), event.stageId(), event.stageAttemptId(), info, group));
  }

  @Override
  public void onTaskEnd(SparkListenerTaskEnd event) {
    TaskEndReason reason = event.reason();
    String kind;
    if (reason instanceof ExecutorLostFailure) {
      kind = "ExecutorLostFailure";
    } else if (reason instanceof TaskKilled) {
      kind = "TaskKilled";
    } else if (reason instanceof ExceptionFailure) {
      kind = "ExceptionFailure";
    } else {
      return;
    }
    KoloEvent out =
        task(
            KoloEvent.of("taskFailed"),
            event.stageId(),
            event.stageAttemptId(),
            event.taskInfo(),
            stageGroups.get(event.stageId()));
    out.put("failure", kind).put("reason", ((TaskFailedReason) reason).toErrorString());
    if (reason instanceof ExecutorLostFailure lost) {
      out.put("exitCausedByApp", lost.exitCausedByApp());
      out.put("lossReason", lost.reason().isDefined() ? lost.reason().get() : null);
    }
    queue.offer(out);
  }

  private static KoloEvent task(
      KoloEvent event, int stageId, int stageAttemptId, TaskInfo info, String group) {
    return event
        .put("stageId", stageId)
        .put("stageAttemptId", stageAttemptId)
        .put("taskId", info.taskId())
        .put("partition", info.index())
        .put("attempt", info.attemptNumber())
        .put("executorId", info.executorId())
        .put("host", info.host())
        .put("group", group);
  }
}
