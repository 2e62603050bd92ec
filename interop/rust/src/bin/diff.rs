//! Differential client: the published `open-feature-flagd` crate evaluating a corpus of flag
//! configuration documents, either from files (the provider's file resolver) or synced from
//! flagd-proxy (its in-process resolver). The protocol is `interop/differential.md`.
//!
//! Environment:
//!   INTEROP_DIFF_JOB (the job file, required),
//!   INTEROP_DEBUG (any value: provider debug logging on stderr; RUST_LOG also works).
//!
//! Stdout: one JSON object per document. Everything else goes to stderr.
//!
//! How this provider maps onto the protocol's events: it emits none. `FlagdProvider::new`
//! returns once the first flag configuration has been loaded (READY) or fails with an error
//! (ERROR, the error's text as `detail`). It has no shutdown either; each document therefore
//! runs on a runtime of its own, which is dropped afterwards together with every task the
//! provider spawned (sync streams, reconnect loops).

use std::collections::VecDeque;
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use open_feature::provider::NoOpProvider;
use open_feature::{
    EvaluationContext, EvaluationContextFieldValue, EvaluationError, EvaluationErrorCode,
    EvaluationReason, OpenFeature, StructValue, Value,
};
use open_feature_flagd::{FlagdOptions, FlagdProvider, ResolverType};
use serde_json::{Map, Value as Json, json};

const MAX_PARALLEL: usize = 8;
const HANG_GUARD: Duration = Duration::from_secs(15);
const STRING_DEFAULT: &str = "<default>";
const FLOAT_DEFAULT: f64 = -1.0;
const WORKER_STACK: usize = 8 * 1024 * 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    File,
    Sync,
}

struct Job {
    mode: Result<Mode, String>,
    host: String,
    port: Result<u16, String>,
    contexts: Vec<Json>,
}

struct Document {
    index: usize,
    id: String,
    path: Option<String>,
    selector: Option<String>,
    flags: Vec<String>,
    served: bool,
    /// A problem with the document's own entry in the job file.
    invalid: Option<String>,
}

fn log(message: &str) {
    eprintln!("interop-rust-diff: {message}");
}

fn init_logging() {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => v,
        _ if std::env::var_os("INTEROP_DEBUG").is_some() => "debug,h2=info,hyper=info".to_string(),
        _ => "warn".to_string(),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

fn emit(out: &Mutex<()>, line: &Json) {
    let text = line.to_string();
    let _guard = out.lock().unwrap_or_else(|e| e.into_inner());
    let mut stdout = std::io::stdout().lock();
    if writeln!(stdout, "{text}")
        .and_then(|()| stdout.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

fn not_ready(id: &str, event: &str, detail: Option<String>) -> Json {
    let mut line = Map::new();
    line.insert("id".into(), Json::String(id.to_string()));
    line.insert("ready".into(), Json::Bool(false));
    line.insert("event".into(), Json::String(event.to_string()));
    if let Some(detail) = detail {
        line.insert("detail".into(), Json::String(detail));
    }
    Json::Object(line)
}

// ---------------------------------------------------------------------------------------------
// The job file
// ---------------------------------------------------------------------------------------------

fn read_job(path: &str) -> Result<(Job, Vec<Document>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let root: Json = serde_json::from_str(&text).map_err(|e| format!("{path} is not JSON: {e}"))?;
    let root = root
        .as_object()
        .ok_or_else(|| format!("{path}: the job is not a JSON object"))?;

    let mode = match root.get("mode").and_then(Json::as_str) {
        Some("file") => Ok(Mode::File),
        Some("sync") => Ok(Mode::Sync),
        Some(other) => Err(format!("unknown mode {other:?}")),
        None => Err("the job has no mode".to_string()),
    };
    let host = root
        .get("host")
        .and_then(Json::as_str)
        .unwrap_or("127.0.0.1")
        .to_string();
    let port = match root.get("port") {
        Some(Json::Number(n)) => n
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("the job's port is not a port: {n}")),
        Some(Json::String(s)) => s
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("the job's port is not a port: {s:?}")),
        Some(other) => Err(format!("the job's port is not a port: {other}")),
        None => Err("the job has no port".to_string()),
    };
    let contexts = match root.get("contexts") {
        Some(Json::Array(items)) => items.clone(),
        _ => vec![Json::Object(Map::new())],
    };
    let documents = match root.get("documents") {
        Some(Json::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(index, item)| read_document(index, item))
            .collect(),
        Some(_) => return Err(format!("{path}: \"documents\" is not an array")),
        None => Vec::new(),
    };
    Ok((
        Job {
            mode,
            host,
            port,
            contexts,
        },
        documents,
    ))
}

fn read_document(index: usize, item: &Json) -> Document {
    let text = |key: &str| item.get(key).and_then(Json::as_str).map(str::to_string);
    let id = match item.get("id") {
        Some(Json::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => format!("#{index}"),
    };
    let mut invalid = None;
    if !item.is_object() {
        invalid = Some(format!("document entry {index} is not a JSON object"));
    }
    let flags = match item.get("flags") {
        Some(Json::Array(keys)) => keys
            .iter()
            .map(|k| match k {
                Json::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect(),
        None => Vec::new(),
        Some(_) => {
            invalid.get_or_insert_with(|| format!("document {id}: \"flags\" is not an array"));
            Vec::new()
        }
    };
    Document {
        index,
        id,
        path: text("path"),
        selector: text("selector"),
        flags,
        served: item.get("served").and_then(Json::as_bool).unwrap_or(true),
        invalid,
    }
}

// ---------------------------------------------------------------------------------------------
// JSON <-> OpenFeature values
// ---------------------------------------------------------------------------------------------

fn json_to_value(v: &Json) -> Option<Value> {
    Some(match v {
        Json::Null => return None,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64()?),
        },
        Json::String(s) => Value::String(s.clone()),
        Json::Array(items) => Value::Array(items.iter().filter_map(json_to_value).collect()),
        Json::Object(map) => Value::Struct(json_to_struct(map)),
    })
}

fn json_to_struct(map: &Map<String, Json>) -> StructValue {
    let mut out = StructValue::default();
    for (k, v) in map {
        if let Some(v) = json_to_value(v) {
            out.add_field(k.clone(), v);
        }
    }
    out
}

fn build_context(spec: &Json) -> EvaluationContext {
    let mut ctx = EvaluationContext::default();
    let Some(map) = spec.as_object() else {
        return ctx;
    };
    for (key, v) in map {
        if key == "targetingKey" {
            match v {
                Json::String(s) => ctx.targeting_key = Some(s.clone()),
                Json::Null => {}
                other => ctx.targeting_key = Some(other.to_string()),
            }
            continue;
        }
        let field = match v {
            Json::Null => continue,
            Json::Bool(b) => EvaluationContextFieldValue::Bool(*b),
            Json::Number(n) => match n.as_i64() {
                Some(i) => EvaluationContextFieldValue::Int(i),
                None => match n.as_f64() {
                    Some(f) => EvaluationContextFieldValue::Float(f),
                    None => continue,
                },
            },
            Json::String(s) => EvaluationContextFieldValue::String(s.clone()),
            Json::Array(items) => EvaluationContextFieldValue::new_struct(Value::Array(
                items.iter().filter_map(json_to_value).collect(),
            )),
            Json::Object(obj) => EvaluationContextFieldValue::new_struct(json_to_struct(obj)),
        };
        ctx.custom_fields.insert(key.clone(), field);
    }
    ctx
}

fn value_to_json(v: &Value) -> Json {
    match v {
        Value::Bool(b) => Json::Bool(*b),
        Value::Int(i) => Json::from(*i),
        Value::Float(f) => float_to_json(*f),
        Value::String(s) => Json::String(s.clone()),
        Value::Array(items) => Json::Array(items.iter().map(value_to_json).collect()),
        Value::Struct(s) => struct_to_json(s),
    }
}

fn struct_to_json(s: &StructValue) -> Json {
    Json::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn float_to_json(f: f64) -> Json {
    serde_json::Number::from_f64(f)
        .map(Json::Number)
        .unwrap_or(Json::Null)
}

fn reason_text(reason: &EvaluationReason) -> String {
    match reason {
        EvaluationReason::Other(s) => s.to_uppercase(),
        other => other.to_string(),
    }
}

fn error_code_text(code: &EvaluationErrorCode) -> String {
    match code {
        // Its Display is the free-form message; the protocol wants the code's name.
        EvaluationErrorCode::General(_) => "GENERAL".to_string(),
        other => other.to_string(),
    }
}

fn answer(
    value: Json,
    variant: Option<String>,
    reason: Option<&EvaluationReason>,
    error_code: Option<String>,
) -> Json {
    json!({
        "value": value,
        "variant": variant,
        "reason": reason.map(reason_text),
        "errorCode": error_code,
    })
}

fn failed(default: Json, error: &EvaluationError, debug: bool, what: &str) -> Json {
    if debug {
        log(&format!(
            "{what}: {} ({})",
            error_code_text(&error.code),
            error.message.as_deref().unwrap_or("")
        ));
    }
    answer(
        default,
        None,
        Some(&EvaluationReason::Error),
        Some(error_code_text(&error.code)),
    )
}

// ---------------------------------------------------------------------------------------------
// One document
// ---------------------------------------------------------------------------------------------

fn options_for(job: &Job, mode: Mode, doc: &Document) -> Result<FlagdOptions, String> {
    let mut options = FlagdOptions {
        // Evaluation reads the loaded flag store directly; caching is for the RPC resolver.
        cache_settings: None,
        tls: false,
        cert_path: None,
        socket_path: None,
        target_uri: None,
        ..FlagdOptions::default()
    };
    match mode {
        Mode::File => {
            let path = doc
                .path
                .clone()
                .ok_or_else(|| format!("document {} has no path", doc.id))?;
            options.resolver_type = ResolverType::File;
            options.source_configuration = Some(path);
            options.selector = None;
        }
        Mode::Sync => {
            options.resolver_type = ResolverType::InProcess;
            options.host = job.host.clone();
            options.port = job.port.clone()?;
            options.selector = doc.selector.clone();
            options.source_configuration = None;
        }
    }
    Ok(options)
}

async fn evaluate_all(
    domain: &str,
    flags: &[String],
    contexts: &[EvaluationContext],
    debug: bool,
) -> Json {
    let client = OpenFeature::singleton().await.create_named_client(domain);
    let object_default = json!({"default": true});
    let mut answers = Map::new();
    for flag in flags {
        let mut per_context = Vec::with_capacity(contexts.len());
        for ctx in contexts {
            let ctx = Some(ctx);
            let b = match client.get_bool_details(flag, ctx, None).await {
                Ok(d) => answer(Json::Bool(d.value), d.variant, d.reason.as_ref(), None),
                Err(e) => failed(Json::Bool(false), &e, debug, flag),
            };
            let s = match client.get_string_details(flag, ctx, None).await {
                Ok(d) => answer(Json::String(d.value), d.variant, d.reason.as_ref(), None),
                Err(e) => failed(Json::String(STRING_DEFAULT.into()), &e, debug, flag),
            };
            let n = match client.get_float_details(flag, ctx, None).await {
                Ok(d) => answer(float_to_json(d.value), d.variant, d.reason.as_ref(), None),
                Err(e) => failed(float_to_json(FLOAT_DEFAULT), &e, debug, flag),
            };
            let o = match client
                .get_struct_details::<StructValue>(flag, ctx, None)
                .await
            {
                Ok(d) => answer(struct_to_json(&d.value), d.variant, d.reason.as_ref(), None),
                Err(e) => failed(object_default.clone(), &e, debug, flag),
            };
            per_context.push(Json::Array(vec![b, s, n, o]));
        }
        answers.insert(flag.clone(), Json::Array(per_context));
    }
    Json::Object(answers)
}

async fn run_document(job: &Job, doc: &Document, contexts: &[EvaluationContext]) -> Json {
    if let Some(problem) = &doc.invalid {
        return not_ready(&doc.id, "ERROR", Some(problem.clone()));
    }
    let mode = match &job.mode {
        Ok(mode) => *mode,
        Err(problem) => return not_ready(&doc.id, "ERROR", Some(problem.clone())),
    };
    if mode == Mode::Sync && !doc.served {
        return not_ready(&doc.id, "not served", None);
    }
    let options = match options_for(job, mode, doc) {
        Ok(options) => options,
        Err(problem) => return not_ready(&doc.id, "ERROR", Some(problem)),
    };
    let debug = std::env::var_os("INTEROP_DEBUG").is_some();

    let provider = match tokio::time::timeout(HANG_GUARD, FlagdProvider::new(options)).await {
        Err(_) => return not_ready(&doc.id, "timeout", None),
        Ok(Err(e)) => return not_ready(&doc.id, "ERROR", Some(e.to_string())),
        Ok(Ok(provider)) => provider,
    };

    let domain = format!("interop-diff/{}/{}", doc.index, doc.id);
    OpenFeature::singleton_mut()
        .await
        .set_named_provider(&domain, provider)
        .await;
    let answers = evaluate_all(&domain, &doc.flags, contexts, debug).await;
    // Releases the document's provider (the registry drops the one it replaces).
    OpenFeature::singleton_mut()
        .await
        .set_named_provider(&domain, NoOpProvider::default())
        .await;

    json!({"id": doc.id, "ready": true, "answers": answers})
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Runs one document on a runtime of its own, so that shutting the runtime down also ends
/// whatever the provider left running.
fn handle(job: &Job, doc: &Document, contexts: &[EvaluationContext]) -> Json {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return not_ready(&doc.id, "ERROR", Some(format!("no runtime: {e}"))),
    };
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        runtime.block_on(Box::pin(run_document(job, doc, contexts)))
    }));
    runtime.shutdown_background();
    match result {
        Ok(line) => line,
        Err(payload) => not_ready(
            &doc.id,
            "ERROR",
            Some(format!("client panic: {}", panic_text(payload.as_ref()))),
        ),
    }
}

fn main() {
    init_logging();

    let job_path = match std::env::var("INTEROP_DIFF_JOB") {
        Ok(v) if !v.is_empty() => v,
        _ => {
            log("environment variable INTEROP_DIFF_JOB is required");
            std::process::exit(2);
        }
    };
    let (job, documents) = match read_job(&job_path) {
        Ok(parsed) => parsed,
        Err(problem) => {
            log(&problem);
            std::process::exit(2);
        }
    };
    let contexts: Arc<Vec<EvaluationContext>> =
        Arc::new(job.contexts.iter().map(build_context).collect());
    let job = Arc::new(job);
    let queue = Arc::new(Mutex::new(documents.into_iter().collect::<VecDeque<_>>()));
    let out = Arc::new(Mutex::new(()));

    let workers = queue
        .lock()
        .map(|q| q.len())
        .unwrap_or(0)
        .clamp(1, MAX_PARALLEL);
    let mut handles = Vec::with_capacity(workers);
    for n in 0..workers {
        let (job, contexts, queue, out) =
            (job.clone(), contexts.clone(), queue.clone(), out.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("diff-worker-{n}"))
            .stack_size(WORKER_STACK)
            .spawn(move || {
                loop {
                    let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
                    let Some(doc) = next else { break };
                    let line = handle(&job, &doc, &contexts);
                    emit(&out, &line);
                }
            });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => log(&format!("cannot start worker {n}: {e}")),
        }
    }
    if handles.is_empty() {
        // No worker thread could be started: handle the documents here.
        loop {
            let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
            let Some(doc) = next else { break };
            let line = handle(&job, &doc, &contexts);
            emit(&out, &line);
        }
    }
    for h in handles {
        if h.join().is_err() {
            log("a worker ended abnormally");
        }
    }
    std::process::exit(0);
}
