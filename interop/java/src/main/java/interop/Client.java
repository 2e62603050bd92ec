// Interop client: the published Java flagd provider (dev.openfeature.contrib.providers:flagd),
// in-process resolver, syncing from flagd-proxy over gRPC.
//
// Environment:
//   FLAGD_HOST, FLAGD_PORT, FLAGD_SOURCE_SELECTOR, FLAGD_TLS (true/false),
//   FLAGD_SERVER_CERT_PATH (CA file, TLS only), INTEROP_FLAG_KEY (a string flag),
//   INTEROP_SOCKET_PATH (a unix socket to sync from instead of FLAGD_HOST:FLAGD_PORT: the
//   provider's `socketPath`), INTEROP_DEBUG (any value: provider debug logging on stderr),
//   INTEROP_EVENTS (`1`: also print every provider event on stdout, see below, and set the
//   retry grace period (10 s) and the stream deadline (600,000 ms) explicitly: this provider
//   version has a 5 s grace period by default and no option for the retry backoff's maximum).
//
// Stdout protocol: `READY` once the provider is ready, then `VALUE <value>` each time the
// evaluated value differs from the last printed one; with INTEROP_EVENTS=1, also
// `EVENT <READY|STALE|ERROR|CHANGED> <unix millis>` for every provider event as it is emitted.
// Provider events are logged on stderr as `interop-java: event <type>: <message>`. The process
// exits when stdin reaches EOF.
package interop;

import dev.openfeature.contrib.providers.flagd.Config;
import dev.openfeature.contrib.providers.flagd.FlagdOptions;
import dev.openfeature.contrib.providers.flagd.FlagdProvider;
import dev.openfeature.sdk.EventDetails;
import dev.openfeature.sdk.OpenFeatureAPI;
import java.io.IOException;
import java.io.InputStream;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Locale;
import java.util.Objects;
import java.util.concurrent.CountDownLatch;

public final class Client {
    private static final String DEFAULT_VALUE = "<default>";
    private static final long POLL_MS = 100;
    private static final PrintStream OUT = System.out;

    private Client() {}

    private static void fail(String message) {
        System.err.println("interop-java: " + message);
        System.err.flush();
        Runtime.getRuntime().halt(2);
    }

    private static String required(String name) {
        String value = System.getenv(name);
        if (value == null || value.isEmpty()) {
            fail("environment variable " + name + " is required");
        }
        return value;
    }

    private static synchronized void emit(String line) {
        OUT.println(line);
        OUT.flush();
        if (OUT.checkError()) {
            Runtime.getRuntime().halt(0);
        }
    }

    private static final boolean EVENTS = "1".equals(System.getenv("INTEROP_EVENTS"));

    private static void event(String type, EventDetails details) {
        String message = details == null ? "" : Objects.toString(details.getMessage(), "");
        System.err.println("interop-java: event " + type + ": " + message);
        if (EVENTS) {
            emit("EVENT " + type.replace("PROVIDER_", "").replace("CONFIGURATION_CHANGED", "CHANGED")
                    + " " + System.currentTimeMillis());
        }
    }

    public static void main(String[] args) throws InterruptedException {
        // Before the first logger exists: slf4j-simple reads its level once.
        if (!System.getenv().getOrDefault("INTEROP_DEBUG", "").isEmpty()) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "debug");
        }
        String host = required("FLAGD_HOST");
        String portText = required("FLAGD_PORT");
        int port = 0;
        try {
            port = Integer.parseInt(portText);
        } catch (NumberFormatException e) {
            fail("FLAGD_PORT is not a port: " + portText);
        }
        String selector = System.getenv().getOrDefault("FLAGD_SOURCE_SELECTOR", "");
        boolean tls = System.getenv().getOrDefault("FLAGD_TLS", "false").trim().toLowerCase(Locale.ROOT).equals("true");
        String certPath = System.getenv().getOrDefault("FLAGD_SERVER_CERT_PATH", "");
        String flagKey = required("INTEROP_FLAG_KEY");
        String socketPath = System.getenv().getOrDefault("INTEROP_SOCKET_PATH", "");

        if (tls && !certPath.isEmpty() && !Files.isRegularFile(Path.of(certPath))) {
            fail("FLAGD_SERVER_CERT_PATH does not exist: " + certPath);
        }

        // Exit as soon as stdin reaches EOF, so a parent that goes away takes us down.
        Thread stdinWatch = new Thread(() -> {
            InputStream in = System.in;
            byte[] buffer = new byte[4096];
            try {
                while (in.read(buffer) >= 0) {
                    // discard
                }
            } catch (IOException ignored) {
                // treat as EOF
            }
            Runtime.getRuntime().halt(0);
        }, "stdin-eof");
        stdinWatch.setDaemon(true);
        stdinWatch.start();

        FlagdOptions.FlagdOptionsBuilder builder = FlagdOptions.builder()
                .resolverType(Config.Resolver.IN_PROCESS)
                .host(host)
                .port(port)
                .tls(tls);
        if (!selector.isEmpty()) {
            builder.selector(selector);
        }
        if (tls && !certPath.isEmpty()) {
            builder.certPath(certPath);
        }
        if (!socketPath.isEmpty()) {
            builder.socketPath(socketPath);
        }
        if (EVENTS) {
            builder.retryGracePeriod(10).streamDeadlineMs(600_000);
        }
        FlagdProvider provider = new FlagdProvider(builder.build());

        OpenFeatureAPI api = OpenFeatureAPI.getInstance();
        CountDownLatch ready = new CountDownLatch(1);
        api.onProviderReady(details -> {
            event("PROVIDER_READY", details);
            ready.countDown();
        });
        api.onProviderError(details -> event("PROVIDER_ERROR", details));
        api.onProviderStale(details -> event("PROVIDER_STALE", details));
        api.onProviderConfigurationChanged(details -> event("PROVIDER_CONFIGURATION_CHANGED", details));

        // A first attempt that misses the provider's deadline leaves it in an error state until
        // its own reconnect succeeds and it emits PROVIDER_READY.
        try {
            api.setProviderAndWait(provider);
            ready.countDown();
        } catch (RuntimeException e) {
            System.err.println("interop-java: initial connection failed, the provider keeps retrying: " + e);
        }
        ready.await();
        emit("READY");

        dev.openfeature.sdk.Client client = api.getClient();
        String last = null;
        String lastError = null;
        while (true) {
            String value;
            try {
                value = client.getStringValue(flagKey, DEFAULT_VALUE);
                lastError = null;
            } catch (RuntimeException e) {
                String text = e.toString();
                if (!text.equals(lastError)) {
                    System.err.println("interop-java: evaluation of " + flagKey + " failed: " + text);
                    lastError = text;
                }
                value = DEFAULT_VALUE;
            }
            if (!value.equals(last)) {
                emit("VALUE " + value);
                last = value;
            }
            Thread.sleep(POLL_MS);
        }
    }
}
