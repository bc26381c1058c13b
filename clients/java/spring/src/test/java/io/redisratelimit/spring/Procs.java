package io.redisratelimit.spring;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.Executors;
import java.util.stream.Stream;

import com.sun.net.httpserver.HttpServer;

/** Real processes for the gateway tests: Redis with the module, PostgreSQL, an upstream. No mocks. */
final class Procs {
    private Procs() {}

    static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            return s.getLocalPort();
        }
    }

    static void poll(String what, Duration limit, java.util.function.BooleanSupplier ok) throws InterruptedException {
        long deadline = System.nanoTime() + limit.toNanos();
        while (!ok.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException(what + " not ready after " + limit);
            }
            Thread.sleep(20);
        }
    }

    static void deleteTree(Path p) {
        try (Stream<Path> s = Files.walk(p)) {
            s.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
        } catch (IOException ignored) {
            // best effort
        }
    }

    static void run(List<String> cmd) throws IOException, InterruptedException {
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (p.waitFor() != 0) {
            throw new IllegalStateException(String.join(" ", cmd) + " failed: " + out);
        }
    }

    /** A Redis server (rl.server, Debian's redis-server by default) with the module loaded. */
    static final class Redis implements AutoCloseable {
        final int port;
        final Process process;
        final Path dir;

        Redis() throws Exception {
            String server = System.getProperty("rl.server", "redis-server");
            // rl.module=none: a server without the module (managed Redis), where the
            // starter's calls go through the library's Lua twins
            String given = System.getProperty("rl.module", "../../../target/release/libredis_ratelimit.so");
            Path module = given.equals("none") ? null : Path.of(given).toAbsolutePath().normalize();
            if (module != null && !Files.exists(module)) {
                throw new IllegalStateException(module + " is missing (make build)");
            }
            dir = Files.createTempDirectory("rl-java-redis");
            port = freePort();
            List<String> cmd = new ArrayList<>(List.of(server, "--port", Integer.toString(port), "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--dir", dir.toString()));
            if (module != null) {
                cmd.addAll(List.of("--loadmodule", module.toString()));
            }
            System.out.println("[redis] " + server + (module == null ? ", without the module (Lua twins)" : ", with " + module));
            process = new ProcessBuilder(cmd)
                .redirectErrorStream(true).redirectOutput(dir.resolve("log").toFile()).start();
            poll("redis on " + port, Duration.ofSeconds(20), () -> {
                try {
                    return "PONG".equals(command("PING"));
                } catch (IOException e) {
                    return false;
                }
            });
        }

        String uri() {
            return "redis://127.0.0.1:" + port;
        }

        /** One command over a fresh connection; the reply's first line without its type byte. */
        String command(String... args) throws IOException {
            try (Socket s = new Socket()) {
                s.connect(new InetSocketAddress("127.0.0.1", port), 2000);
                s.setSoTimeout(5000);
                send(s.getOutputStream(), args);
                BufferedReader in = new BufferedReader(new InputStreamReader(s.getInputStream(), StandardCharsets.UTF_8));
                String first = in.readLine();
                if (first == null) {
                    throw new IOException("closed");
                }
                if (first.startsWith("$")) {
                    int n = Integer.parseInt(first.substring(1));
                    char[] buf = new char[n];
                    int got = 0;
                    while (got < n) {
                        got += in.read(buf, got, n - got);
                    }
                    return new String(buf);
                }
                if (first.startsWith("*")) {
                    int n = Integer.parseInt(first.substring(1));
                    StringBuilder sb = new StringBuilder();
                    for (int i = 0; i < n; i++) {
                        String h = in.readLine();
                        sb.append(h.startsWith("$") ? in.readLine() : h.substring(1)).append('\n');
                    }
                    return sb.toString();
                }
                return first.substring(1);
            }
        }

        static void send(OutputStream out, String... args) throws IOException {
            StringBuilder sb = new StringBuilder("*").append(args.length).append("\r\n");
            for (String a : args) {
                sb.append('$').append(a.getBytes(StandardCharsets.UTF_8).length).append("\r\n").append(a).append("\r\n");
            }
            out.write(sb.toString().getBytes(StandardCharsets.UTF_8));
            out.flush();
        }

        /** The server's clock, in microseconds (TIME). */
        long timeUs() throws IOException {
            String[] t = command("TIME").split("\n");
            return Long.parseLong(t[0]) * 1_000_000L + Long.parseLong(t[1]);
        }

        void signal(String sig) throws IOException, InterruptedException {
            run(List.of("kill", "-" + sig, Long.toString(process.pid())));
        }

        @Override
        public void close() {
            process.destroyForcibly();
            deleteTree(dir);
        }
    }

    /** MONITOR on a connection of its own: each command's server time (µs) and its words. */
    static final class Monitor implements AutoCloseable {
        record Line(long us, String text) {}

        final List<Line> lines = new ArrayList<>();
        private final Socket socket;
        private final Thread reader;

        Monitor(int port) throws IOException, InterruptedException {
            socket = new Socket("127.0.0.1", port);
            Redis.send(socket.getOutputStream(), "MONITOR");
            InputStream raw = socket.getInputStream();
            BufferedReader in = new BufferedReader(new InputStreamReader(raw, StandardCharsets.UTF_8));
            if (!"+OK".equals(in.readLine())) {
                throw new IOException("MONITOR refused");
            }
            reader = new Thread(() -> {
                try {
                    String l;
                    while ((l = in.readLine()) != null) {
                        // +1733380000.123456 [0 127.0.0.1:5555] "RL.TOKENBUCKET" ...
                        int sp = l.indexOf(' ');
                        String[] ts = l.substring(1, sp).split("\\.");
                        long us = Long.parseLong(ts[0]) * 1_000_000L + Long.parseLong(ts[1]);
                        synchronized (lines) {
                            lines.add(new Line(us, l.substring(sp + 1)));
                        }
                    }
                } catch (IOException ignored) {
                    // closed
                }
            }, "monitor");
            reader.setDaemon(true);
            reader.start();
        }

        List<Line> matching(String needle) {
            synchronized (lines) {
                // the client's own commands only: a script's inner calls (MONITOR's
                // "[0 lua]") are part of the one EVALSHA that made them
                return lines.stream().filter(l -> l.text().contains(needle) && !l.text().contains(" lua] ")).toList();
            }
        }

        @Override
        public void close() throws IOException {
            socket.close();
        }
    }

    /** PostgreSQL from Debian's package: initdb in a temp dir, a free port, trust auth. */
    static final class Postgres implements AutoCloseable {
        final int port;
        final Process process;
        final Path dir;

        Postgres() throws Exception {
            Path bin = Files.list(Path.of("/usr/lib/postgresql")).sorted(Comparator.reverseOrder())
                .map(p -> p.resolve("bin")).filter(p -> Files.exists(p.resolve("postgres"))).findFirst()
                .orElseThrow(() -> new IllegalStateException("no /usr/lib/postgresql/*/bin/postgres (make deps)"));
            dir = Files.createTempDirectory("rl-java-pg");
            List<String> asUser = new ArrayList<>();
            if ("root".equals(System.getProperty("user.name"))) {
                run(List.of("chown", "-R", "postgres", dir.toString()));
                asUser.addAll(List.of("runuser", "-u", "postgres", "--"));
            }
            Path data = dir.resolve("data");
            List<String> init = new ArrayList<>(asUser);
            init.addAll(List.of(bin.resolve("initdb").toString(), "-D", data.toString(), "-U", "rl",
                "--auth=trust", "--no-sync", "-E", "UTF8"));
            run(init);
            port = freePort();
            List<String> start = new ArrayList<>(asUser);
            start.addAll(List.of(bin.resolve("postgres").toString(), "-D", data.toString(), "-p",
                Integer.toString(port), "-k", dir.toString(), "-c", "listen_addresses=127.0.0.1",
                "-c", "fsync=off", "-c", "synchronous_commit=off"));
            process = new ProcessBuilder(start).redirectErrorStream(true)
                .redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
            poll("postgres on " + port, Duration.ofSeconds(30), () -> {
                try (Connection c = connect()) {
                    return true;
                } catch (Exception e) {
                    return false;
                }
            });
        }

        String url() {
            return "jdbc:postgresql://127.0.0.1:" + port + "/postgres";
        }

        Connection connect() throws Exception {
            return DriverManager.getConnection(url(), "rl", "");
        }

        void sql(String s) throws Exception {
            try (Connection c = connect(); var st = c.createStatement()) {
                st.execute(s);
            }
        }

        @Override
        public void close() throws Exception {
            process.destroy();
            process.waitFor();
            deleteTree(dir);
        }
    }

    /** The upstream: 200 "ok" for any path. */
    static HttpServer upstream() throws IOException {
        HttpServer s = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 256);
        s.createContext("/", ex -> {
            byte[] body = "ok".getBytes(StandardCharsets.UTF_8);
            ex.sendResponseHeaders(200, body.length);
            try (OutputStream o = ex.getResponseBody()) {
                o.write(body);
            }
        });
        s.setExecutor(Executors.newFixedThreadPool(8));
        s.start();
        return s;
    }
}
