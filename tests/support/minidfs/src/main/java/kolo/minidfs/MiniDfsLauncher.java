package kolo.minidfs;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.DFSConfigKeys;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

/**
 * Starts a one-NameNode, one-DataNode MiniDFSCluster on 127.0.0.1 for kolo's test suite.
 *
 * <p>Usage: {@code MiniDfsLauncher <namenode-rpc-port> <namenode-http-port> <base-dir>}. Every
 * server binds 127.0.0.1; the DataNode advertises 127.0.0.1; permissions, Kerberos and SASL are
 * off; WebHDFS is on the NameNode HTTP port. When the cluster is up it prints one line on stdout:
 * {@code READY hdfs://127.0.0.1:<rpc-port> http://127.0.0.1:<http-port>}, then runs until stdin
 * closes (or a line arrives on it) or the process gets SIGTERM. Logs go to stderr. Java 17 needs
 * {@code --add-opens java.base/java.lang=ALL-UNNAMED} for WebHDFS (Jersey's JAXB).
 */
public final class MiniDfsLauncher {
  private MiniDfsLauncher() {}

  public static void main(String[] args) throws IOException, InterruptedException {
    if (args.length != 3) {
      System.err.println("usage: MiniDfsLauncher <namenode-rpc-port> <namenode-http-port> <base-dir>");
      System.exit(2);
    }
    int rpcPort = Integer.parseInt(args[0]);
    int httpPort = Integer.parseInt(args[1]);
    File baseDir = new File(args[2]).getAbsoluteFile();

    Configuration conf = new HdfsConfiguration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, baseDir.getPath());
    conf.setBoolean(DFSConfigKeys.DFS_PERMISSIONS_ENABLED_KEY, false);
    conf.setBoolean("dfs.webhdfs.enabled", true);
    conf.setInt(DFSConfigKeys.DFS_REPLICATION_KEY, 1);
    conf.set(DFSConfigKeys.DFS_DATANODE_HOST_NAME_KEY, "127.0.0.1");
    conf.set("hadoop.security.authentication", "simple");
    conf.set("hadoop.security.authorization", "false");
    // Small blocks so multi-block files show up in tests without writing hundreds of MiB.
    conf.setLong(DFSConfigKeys.DFS_BLOCK_SIZE_KEY, 16L * 1024 * 1024);

    MiniDFSCluster cluster =
        new MiniDFSCluster.Builder(conf, baseDir)
            .nameNodePort(rpcPort)
            .nameNodeHttpPort(httpPort)
            .numDataNodes(1)
            .checkDataNodeHostConfig(true)
            .format(true)
            .build();
    cluster.waitActive();
    cluster.waitClusterUp();

    System.out.println(
        "READY hdfs://127.0.0.1:" + cluster.getNameNodePort() + " http://127.0.0.1:" + httpPort);
    System.out.flush();

    BufferedReader stdin =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    stdin.readLine();
    // A clean stop: the NameNode and DataNode close their sockets and storage. On SIGTERM the JVM
    // exits through Hadoop's own shutdown hooks instead, which is also fine for a throwaway dir.
    cluster.shutdown(true);
    System.exit(0);
  }
}
