package io.kolo.spark;

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
    send(report("executorStarted"));
  }

  @Override
  public void shutdown() {
    send(report("executorStopping").put("reason", "the executor is shutting down"));
  }

  private KoloEvent report(String kind) {
    PluginContext ctx = context;
    return KoloEvent.of(kind)
        .put("executorId", ctx.executorID())
        .put("host", ctx.hostname())
        .put("pid", ProcessHandle.current().pid());
  }

  private void send(KoloEvent event) {
    try {
      context.send(event.toJson());
    } catch (Exception error) {
      // The driver may be gone (the application is ending): nothing to tell it then.
    }
  }
}
