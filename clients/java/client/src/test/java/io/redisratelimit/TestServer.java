package io.redisratelimit;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * A real redis-server / valkey-server started by the test on a free port and a temp dir, with the module
 * (RL_MODULE) or without it (the Lua twins). The servers come from RL_SERVERS ("name=binary ...", what
 * make test-java-client passes) or REDIS_SERVER (one binary).
 */
final class TestServer implements AutoCloseable {
    final String name;
    final String binary;
    final boolean module;
    final int port;
    final Path dir;
    private Process proc;

    private static final Map<String, TestServer> SHARED = new ConcurrentHashMap<>();

    static {
        Runtime.getRuntime().addShutdownHook(new Thread(() -> SHARED.values().forEach(TestServer::close)));
    }

    /** name -> binary, in the order given. */
    static Map<String, String> servers() {
        Map<String, String> out = new LinkedHashMap<>();
        String list = System.getenv("RL_SERVERS");
        if (list != null && !list.isBlank()) {
            for (String s : list.trim().split("\\s+")) {
                int eq = s.indexOf('=');
                out.put(s.substring(0, eq), s.substring(eq + 1));
            }
        } else {
            String one = System.getenv("REDIS_SERVER");
            out.put("server", one != null ? one : "redis-server");
        }
        return out;
    }

    /** The first server of the matrix (the outage tests run there). */
    static Map.Entry<String, String> first() {
        return servers().entrySet().iterator().next();
    }

    static String modulePath() {
        String m = System.getenv("RL_MODULE");
        if (m == null) {
            Path p = Path.of("../../../target/release/libredis_ratelimit.so").toAbsolutePath().normalize();
            m = p.toString();
        }
        return m;
    }

    /** One server per (name, module) for the whole JVM (stopped at exit); tests use keys of their own. */
    static TestServer shared(String name, String binary, boolean module) {
        return SHARED.computeIfAbsent(name + "/" + module, k -> new TestServer(name, binary, module, 0));
    }

    TestServer(String name, String binary, boolean module, int port) {
        this.name = name;
        this.binary = binary;
        this.module = module;
        this.port = port > 0 ? port : freePort();
        try {
            this.dir = Files.createTempDirectory("rl-java-");
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
        start();
    }

    static int freePort() {
        try (ServerSocket s = new ServerSocket(0)) {
            return s.getLocalPort();
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    void start() {
        List<String> cmd = new ArrayList<>(List.of(binary, "--port", Integer.toString(port), "--bind", "127.0.0.1",
                "--dir", dir.toString(), "--logfile", "server.log", "--save", "", "--appendonly", "no",
                "--protected-mode", "no"));
        if (module) {
            cmd.add("--loadmodule");
            cmd.add(modulePath());
        }
        try {
            proc = new ProcessBuilder(cmd).directory(dir.toFile()).redirectErrorStream(true)
                    .redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
        } catch (IOException e) {
            throw new IllegalStateException("cannot start " + binary, e);
        }
        long deadline = System.nanoTime() + 30_000_000_000L;
        while (true) {
            if (!proc.isAlive()) {
                throw new IllegalStateException(name + " exited with " + proc.exitValue() + ": " + logTail());
            }
            try {
                if ("+PONG".equals(command("PING"))) {
                    return;
                }
            } catch (IOException e) {
                // not yet listening
            }
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException(name + " did not answer PING: " + logTail());
            }
            Thread.onSpinWait();
            try {
                Thread.sleep(5);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
        }
    }

    String logTail() {
        try {
            List<String> lines = Files.readAllLines(dir.resolve("server.log"));
            return String.join("\n", lines.subList(Math.max(0, lines.size() - 10), lines.size()));
        } catch (IOException e) {
            return "(no log)";
        }
    }

    String url() {
        return "redis://127.0.0.1:" + port;
    }

    long pid() {
        return proc.pid();
    }

    void signal(String sig) {
        try {
            int rc = new ProcessBuilder("kill", "-" + sig, Long.toString(proc.pid())).start().waitFor();
            if (rc != 0) {
                throw new IllegalStateException("kill -" + sig + " failed");
            }
        } catch (IOException | InterruptedException e) {
            throw new IllegalStateException(e);
        }
    }

    void stop() {
        signal("CONT");
        proc.destroyForcibly();
        try {
            proc.waitFor();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** One command over a plain socket (RESP2 inline): the reply's first line. */
    String command(String... args) throws IOException {
        try (Socket s = new Socket()) {
            s.connect(new InetSocketAddress("127.0.0.1", port), 1000);
            s.setSoTimeout(5000);
            StringBuilder b = new StringBuilder("*").append(args.length).append("\r\n");
            for (String a : args) {
                byte[] x = a.getBytes(StandardCharsets.UTF_8);
                b.append('$').append(x.length).append("\r\n").append(a).append("\r\n");
            }
            OutputStream out = s.getOutputStream();
            out.write(b.toString().getBytes(StandardCharsets.UTF_8));
            out.flush();
            InputStream in = s.getInputStream();
            StringBuilder line = new StringBuilder();
            int c;
            while ((c = in.read()) >= 0 && c != '\r') {
                line.append((char) c);
            }
            return line.toString();
        }
    }

    /** command() for tests that must not fail on I/O. */
    String cmd(String... args) {
        try {
            return command(args);
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    @Override
    public void close() {
        if (proc != null && proc.isAlive()) {
            stop();
        }
    }
}
