package io.kolo.spark;

import java.io.IOException;
import java.net.InetAddress;
import java.util.Map;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;

/**
 * The executor side of {@link KoloSparkPlugin}: tells the driver its executor's pid and host
 * when it starts ({@code executorStarted}) and that it shuts down gracefully ({@code
 * executorStopping}: decommission, dynamic-allocation release, application end) before it goes.
 * Sends never wait for an answer; a failed send is dropped.
 */
public class KoloExecutorPlugin implements ExecutorPlugin {
  private volatile PluginContext context;

  /** The executor plugin (created by {@link KoloSparkPlugin}). */
  public KoloExecutorPlugin() {}

  @Override
  public void init(PluginContext ctx, Map<String, String> extraConf) {
    context = ctx;
    send("executorStarted", null);
  }

  @Override
  public void shutdown() {
    send("executorStopping", "the executor is shutting down");
  }

  /**
   * This host's name. Not {@code PluginContext.hostname()}: on an executor it reads the address
   * of an RpcEnv that has none (client mode) and throws.
   */
  static String localHostName() {
    try {
      return InetAddress.getLocalHost().getHostName();
    } catch (IOException | RuntimeException error) {
      return null;
    }
  }

  /** Sends a report; nothing thrown here may reach Spark (it would stop the executor). */
  private void send(String kind, String reason) {
    try {
      KoloEvent event =
          KoloEvent.of(kind)
              .put("executorId", context.executorID())
              .put("host", localHostName())
              .put("pid", ProcessHandle.current().pid());
      if (reason != null) {
        event.put("reason", reason);
      }
      context.send(event.toJson());
    } catch (Exception error) {
      // The driver may be gone (the application is ending): nothing to tell it then.
    }
  }
}
