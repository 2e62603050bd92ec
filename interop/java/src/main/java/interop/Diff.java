// Differential program: the published Java flagd provider (dev.openfeature.contrib.providers:flagd),
// in-process resolver, evaluating every flag of each document either read from a file (offline
// file mode) or synced from flagd-proxy over gRPC. Protocol: interop/differential.md.
//
// Environment: INTEROP_DIFF_JOB names the job file.
//
// Stdout: one JSON object per document. Everything else (this program's and the provider's logs)
// goes to stderr.
package interop;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import dev.openfeature.contrib.providers.flagd.Config;
import dev.openfeature.contrib.providers.flagd.FlagdOptions;
import dev.openfeature.contrib.providers.flagd.FlagdProvider;
import dev.openfeature.sdk.EvaluationContext;
import dev.openfeature.sdk.FlagEvaluationDetails;
import dev.openfeature.sdk.ImmutableContext;
import dev.openfeature.sdk.MutableStructure;
import dev.openfeature.sdk.OpenFeatureAPI;
import dev.openfeature.sdk.ProviderState;
import dev.openfeature.sdk.Structure;
import dev.openfeature.sdk.Value;
import java.io.File;
import java.io.PrintStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;

public final class Diff {
    private static final int MAX_PARALLEL = 8;
    private static final long READY_TIMEOUT_SECONDS = 15;
    private static final long SHUTDOWN_TIMEOUT_SECONDS = 10;
    // The provider's initialization waits twice its `deadline` for the first flag configuration,
    // and the SDK then reports an initialization error; a document the provider cannot load (not
    // JSON, no flags, no file) never becomes ready and ends that way too. The default (500 ms) is
    // shorter than a cold JVM takes to load the provider's JSON schema with several documents
    // starting at once, so the wait is lengthened to 6 s, still inside the 15 s hang guard. The
    // deadline otherwise bounds the sync mode's GetMetadata call and the channel's shutdown.
    private static final int DEADLINE_MS = 3_000;
    private static final String STRING_DEFAULT = "<default>";
    private static final double NUMBER_DEFAULT = -1.0;

    private static final JsonNodeFactory NODES = JsonNodeFactory.instance;
    private static final ObjectMapper MAPPER = new ObjectMapper();

    // The real stdout, kept for the result lines; System.out is pointed at stderr so that
    // nothing else can write there.
    private static PrintStream out;

    // Runs initializations and shutdowns, which may block past their guards.
    private static final ExecutorService BLOCKING = Executors.newCachedThreadPool(daemon("diff-blocking"));

    private Diff() {}

    /** One document of the job. */
    private static final class Document {
        final int index;
        final String id;
        final String path;
        final String selector;
        final List<String> flags;
        final boolean served;

        Document(int index, String id, String path, String selector, List<String> flags, boolean served) {
            this.index = index;
            this.id = id;
            this.path = path;
            this.selector = selector;
            this.flags = flags;
            this.served = served;
        }
    }

    /** The job's settings shared by every document. */
    private static final class Job {
        final String mode;
        final String host;
        final int port;
        final List<EvaluationContext> contexts;

        Job(String mode, String host, int port, List<EvaluationContext> contexts) {
            this.mode = mode;
            this.host = host;
            this.port = port;
            this.contexts = contexts;
        }
    }

    private static ThreadFactory daemon(String prefix) {
        AtomicInteger count = new AtomicInteger();
        return runnable -> {
            Thread thread = new Thread(runnable, prefix + "-" + count.incrementAndGet());
            thread.setDaemon(true);
            return thread;
        };
    }

    private static void log(String message) {
        System.err.println("interop-java-diff: " + message);
        System.err.flush();
    }

    private static synchronized void emit(ObjectNode line) {
        String text;
        try {
            text = MAPPER.writeValueAsString(line);
        } catch (Exception e) {
            ObjectNode fallback = NODES.objectNode();
            fallback.set("id", line.get("id"));
            fallback.put("ready", false);
            fallback.put("event", "exception");
            fallback.put("detail", "writing the result: " + describe(e));
            text = fallback.toString();
        }
        out.println(text);
        out.flush();
    }

    private static String describe(Throwable e) {
        String message = e.getMessage();
        if (message == null || message.isEmpty()) {
            return e.getClass().getName();
        }
        return message;
    }

    private static String stackTrace(Throwable e) {
        StringWriter writer = new StringWriter();
        e.printStackTrace(new PrintWriter(writer));
        return writer.toString();
    }

    // ---- job reading ----------------------------------------------------------------------

    private static String text(JsonNode node, String field, String fallback) {
        JsonNode value = node == null ? null : node.get(field);
        if (value == null || value.isNull()) {
            return fallback;
        }
        return value.isTextual() ? value.asText() : value.toString();
    }

    /** A JSON value from the job as an SDK value. */
    private static Value toValue(JsonNode node) {
        if (node == null || node.isNull() || node.isMissingNode()) {
            return new Value();
        }
        if (node.isBoolean()) {
            return new Value(node.booleanValue());
        }
        if (node.isTextual()) {
            return new Value(node.textValue());
        }
        if (node.isIntegralNumber() && node.canConvertToInt()) {
            return new Value(node.intValue());
        }
        // Wider integers as doubles: the provider's targeting answers GENERAL for a Long
        // attribute, and the other clients see every JSON number as a double anyway.
        if (node.isNumber()) {
            return new Value(node.doubleValue());
        }
        if (node.isArray()) {
            List<Value> items = new ArrayList<>();
            for (JsonNode item : node) {
                items.add(toValue(item));
            }
            return new Value(items);
        }
        if (node.isObject()) {
            Map<String, Value> fields = new LinkedHashMap<>();
            for (Map.Entry<String, JsonNode> entry : node.properties()) {
                fields.put(entry.getKey(), toValue(entry.getValue()));
            }
            return new Value(new MutableStructure(fields));
        }
        return new Value(node.asText());
    }

    private static EvaluationContext toContext(JsonNode node) {
        Map<String, Value> attributes = new LinkedHashMap<>();
        String targetingKey = null;
        if (node != null && node.isObject()) {
            for (Map.Entry<String, JsonNode> entry : node.properties()) {
                if (entry.getKey().equals("targetingKey")) {
                    JsonNode key = entry.getValue();
                    if (key != null && !key.isNull()) {
                        targetingKey = key.isTextual() ? key.textValue() : key.toString();
                    }
                } else {
                    attributes.put(entry.getKey(), toValue(entry.getValue()));
                }
            }
        }
        return targetingKey == null
                ? new ImmutableContext(attributes)
                : new ImmutableContext(targetingKey, attributes);
    }

    // ---- results --------------------------------------------------------------------------

    /** An SDK value as JSON. */
    private static JsonNode toJson(Object value) {
        if (value == null) {
            return NODES.nullNode();
        }
        if (value instanceof Value) {
            Value v = (Value) value;
            if (v.isNull()) {
                return NODES.nullNode();
            }
            if (v.isBoolean()) {
                return NODES.booleanNode(v.asBoolean());
            }
            if (v.isString()) {
                return NODES.textNode(v.asString());
            }
            if (v.isNumber()) {
                return toJson(v.asObject());
            }
            if (v.isStructure()) {
                return toJson(v.asStructure());
            }
            if (v.isList()) {
                ArrayNode array = NODES.arrayNode();
                for (Value item : v.asList()) {
                    array.add(toJson(item));
                }
                return array;
            }
            if (v.isInstant()) {
                return NODES.textNode(v.asInstant().toString());
            }
            return toJson(v.asObject());
        }
        if (value instanceof Structure) {
            Structure structure = (Structure) value;
            ObjectNode object = NODES.objectNode();
            for (String key : structure.keySet()) {
                object.set(key, toJson(structure.getValue(key)));
            }
            return object;
        }
        if (value instanceof Boolean) {
            return NODES.booleanNode((Boolean) value);
        }
        if (value instanceof String) {
            return NODES.textNode((String) value);
        }
        if (value instanceof Integer) {
            return NODES.numberNode((Integer) value);
        }
        if (value instanceof Long) {
            return NODES.numberNode((Long) value);
        }
        if (value instanceof Double) {
            double d = (Double) value;
            return Double.isFinite(d) ? NODES.numberNode(d) : NODES.textNode(Double.toString(d));
        }
        if (value instanceof Float) {
            float f = (Float) value;
            return Float.isFinite(f) ? NODES.numberNode(f) : NODES.textNode(Float.toString(f));
        }
        if (value instanceof BigDecimal) {
            return NODES.numberNode((BigDecimal) value);
        }
        if (value instanceof BigInteger) {
            return NODES.numberNode((BigInteger) value);
        }
        if (value instanceof Number) {
            return NODES.numberNode(((Number) value).doubleValue());
        }
        if (value instanceof List) {
            ArrayNode array = NODES.arrayNode();
            for (Object item : (List<?>) value) {
                array.add(toJson(item));
            }
            return array;
        }
        if (value instanceof Map) {
            ObjectNode object = NODES.objectNode();
            for (Map.Entry<?, ?> entry : ((Map<?, ?>) value).entrySet()) {
                object.set(String.valueOf(entry.getKey()), toJson(entry.getValue()));
            }
            return object;
        }
        return NODES.textNode(value.toString());
    }

    private static ObjectNode details(FlagEvaluationDetails<?> details) {
        ObjectNode node = NODES.objectNode();
        node.set("value", toJson(details.getValue()));
        String variant = details.getVariant();
        if (variant == null) {
            node.putNull("variant");
        } else {
            node.put("variant", variant);
        }
        String reason = details.getReason();
        if (reason == null) {
            node.putNull("reason");
        } else {
            node.put("reason", reason);
        }
        if (details.getErrorCode() == null) {
            node.putNull("errorCode");
        } else {
            node.put("errorCode", details.getErrorCode().name());
        }
        return node;
    }

    private static ObjectNode notReady(Document doc, String event, String detail) {
        ObjectNode line = NODES.objectNode();
        line.put("id", doc.id);
        line.put("ready", false);
        line.put("event", event);
        if (detail != null) {
            line.put("detail", detail);
        }
        return line;
    }

    // ---- one document ---------------------------------------------------------------------

    private static FlagdProvider provider(Job job, Document doc) {
        FlagdOptions.FlagdOptionsBuilder builder = FlagdOptions.builder()
                .resolverType(Config.Resolver.IN_PROCESS)
                .deadline(DEADLINE_MS);
        if (job.mode.equals("file")) {
            builder.offlineFlagSourcePath(doc.path);
        } else {
            builder.host(job.host).port(job.port).tls(false).selector(doc.selector);
        }
        return new FlagdProvider(builder.build());
    }

    private static void guarded(String what, Runnable action, Document doc) {
        CompletableFuture<Void> done = CompletableFuture.runAsync(action, BLOCKING);
        try {
            done.get(SHUTDOWN_TIMEOUT_SECONDS, TimeUnit.SECONDS);
        } catch (TimeoutException e) {
            log(doc.id + ": " + what + " did not end within " + SHUTDOWN_TIMEOUT_SECONDS + " s");
        } catch (ExecutionException e) {
            log(doc.id + ": " + what + ": " + describe(e.getCause() == null ? e : e.getCause()));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /**
     * Shuts the document's provider down. An initialization still under way holds the API's
     * lock, which the API's own shutdown waits for: the provider is stopped directly first.
     */
    private static void shutDown(OpenFeatureAPI api, FlagdProvider provider, boolean initPending, Document doc) {
        if (initPending && provider != null) {
            guarded("stopping the provider", provider::shutdown, doc);
        }
        if (api != null) {
            guarded("shutting the provider down", api::shutdown, doc);
        }
    }

    private static ObjectNode evaluate(OpenFeatureAPI api, String domain, Job job, Document doc) {
        dev.openfeature.sdk.Client client = api.getClient(domain);
        Map<String, Value> objectDefaultFields = new LinkedHashMap<>();
        objectDefaultFields.put("default", new Value(true));
        Value objectDefault = new Value(new MutableStructure(objectDefaultFields));

        ObjectNode answers = NODES.objectNode();
        for (String flag : doc.flags) {
            ArrayNode perContext = NODES.arrayNode();
            for (EvaluationContext context : job.contexts) {
                ArrayNode four = NODES.arrayNode();
                four.add(details(client.getBooleanDetails(flag, false, context)));
                four.add(details(client.getStringDetails(flag, STRING_DEFAULT, context)));
                four.add(details(client.getDoubleDetails(flag, NUMBER_DEFAULT, context)));
                four.add(details(client.getObjectDetails(flag, objectDefault, context)));
                perContext.add(four);
            }
            answers.set(flag, perContext);
        }
        ObjectNode line = NODES.objectNode();
        line.put("id", doc.id);
        line.put("ready", true);
        line.set("answers", answers);
        return line;
    }

    private static void run(Job job, Document doc) {
        if (job.mode.equals("sync") && !doc.served) {
            emit(notReady(doc, "not served", null));
            return;
        }
        String domain = "interop-diff-" + doc.index + "-" + doc.id;
        OpenFeatureAPI api = null;
        FlagdProvider provider = null;
        CompletableFuture<Void> init = null;
        ObjectNode line;
        try {
            api = OpenFeatureAPI.createIsolated();
            provider = provider(job, doc);
            OpenFeatureAPI target = api;
            FlagdProvider created = provider;
            init = CompletableFuture.runAsync(() -> target.setProviderAndWait(domain, created), BLOCKING);
            String failure = null;
            boolean timedOut = false;
            try {
                init.get(READY_TIMEOUT_SECONDS, TimeUnit.SECONDS);
            } catch (TimeoutException e) {
                timedOut = true;
            } catch (ExecutionException e) {
                Throwable cause = e.getCause() == null ? e : e.getCause();
                failure = describe(cause);
            }
            if (timedOut) {
                line = notReady(doc, "timeout", null);
            } else if (failure != null) {
                line = notReady(doc, "ERROR", failure);
            } else {
                ProviderState state = api.getClient(domain).getProviderState();
                if (state != ProviderState.READY) {
                    line = notReady(doc, "ERROR", "provider state " + state + " after initialization");
                } else {
                    line = evaluate(api, domain, job, doc);
                }
            }
        } catch (Throwable e) {
            log(doc.id + ": " + stackTrace(e));
            line = notReady(doc, "exception", e.getClass().getName() + ": " + describe(e));
        }
        emit(line);
        shutDown(api, provider, init != null && !init.isDone(), doc);
    }

    // ---- main -----------------------------------------------------------------------------

    public static void main(String[] args) {
        out = System.out;
        System.setOut(System.err);
        // Before the first logger exists: slf4j-simple reads its settings once.
        System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");

        int status = 0;
        try {
            status = runJob();
        } catch (Throwable e) {
            log("the job failed: " + stackTrace(e));
            status = 2;
        }
        out.flush();
        System.err.flush();
        // Provider threads that outlive their shutdown must not hold the process.
        Runtime.getRuntime().halt(status);
    }

    private static int runJob() throws Exception {
        String jobPath = System.getenv("INTEROP_DIFF_JOB");
        if (jobPath == null || jobPath.isEmpty()) {
            log("environment variable INTEROP_DIFF_JOB is required");
            return 2;
        }
        JsonNode root = MAPPER.readTree(new File(jobPath));
        String mode = text(root, "mode", "");
        if (!mode.equals("file") && !mode.equals("sync")) {
            log("unknown mode " + mode + " (file or sync)");
            return 2;
        }
        String host = text(root, "host", "127.0.0.1");
        JsonNode portNode = root.get("port");
        int port = portNode == null || portNode.isNull() ? 0 : portNode.asInt(0);
        if (mode.equals("sync") && port <= 0) {
            log("sync mode needs a port");
            return 2;
        }
        List<EvaluationContext> contexts = new ArrayList<>();
        JsonNode contextsNode = root.get("contexts");
        if (contextsNode != null && contextsNode.isArray()) {
            for (JsonNode context : contextsNode) {
                contexts.add(toContext(context));
            }
        }
        Job job = new Job(mode, host, port, contexts);

        List<Document> documents = new ArrayList<>();
        JsonNode documentsNode = root.get("documents");
        if (documentsNode != null && documentsNode.isArray()) {
            int index = 0;
            for (JsonNode node : documentsNode) {
                List<String> flags = new ArrayList<>();
                JsonNode flagsNode = node.get("flags");
                if (flagsNode != null && flagsNode.isArray()) {
                    for (JsonNode flag : flagsNode) {
                        flags.add(flag.isTextual() ? flag.textValue() : flag.toString());
                    }
                }
                JsonNode served = node.get("served");
                documents.add(new Document(
                        index,
                        text(node, "id", "#" + index),
                        text(node, "path", ""),
                        text(node, "selector", ""),
                        flags,
                        served == null || served.isNull() || served.asBoolean(true)));
                index++;
            }
        }
        log(mode + " mode, " + documents.size() + " documents, " + contexts.size() + " contexts");

        int parallel = Math.max(1, Math.min(MAX_PARALLEL, documents.size()));
        ExecutorService workers = Executors.newFixedThreadPool(parallel, daemon("diff-worker"));
        List<CompletableFuture<Void>> tasks = new ArrayList<>();
        for (Document doc : documents) {
            tasks.add(CompletableFuture.runAsync(() -> {
                try {
                    run(job, doc);
                } catch (Throwable e) {
                    log(doc.id + ": " + stackTrace(e));
                    emit(notReady(doc, "exception", e.getClass().getName() + ": " + describe(e)));
                }
            }, workers));
        }
        for (CompletableFuture<Void> task : tasks) {
            task.join();
        }
        workers.shutdown();
        return 0;
    }
}
