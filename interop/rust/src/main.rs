//! Interop client: the published `open-feature-flagd` crate, in-process resolver,
//! syncing from flagd-proxy over gRPC.
//!
//! Environment:
//!   FLAGD_HOST, FLAGD_PORT, FLAGD_SOURCE_SELECTOR, FLAGD_TLS (true/false),
//!   FLAGD_SERVER_CERT_PATH (CA file, TLS only), INTEROP_FLAG_KEY (a string flag),
//!   INTEROP_SOCKET_PATH (a unix socket to sync from instead of FLAGD_HOST:FLAGD_PORT: the
//!   provider's `socket_path`),
//!   INTEROP_DEBUG (any value: provider debug logging on stderr; RUST_LOG also works).
//!
//! Stdout protocol: `READY` once the provider is ready, then `VALUE <value>` each
//! time the evaluated value differs from the last printed one. Everything else goes
//! to stderr. The process exits when stdin reaches EOF.

use std::io::Write;
use std::time::Duration;

use open_feature::OpenFeature;
use open_feature_flagd::{FlagdOptions, FlagdProvider, ResolverType};
use tokio::io::AsyncReadExt;

const DEFAULT_VALUE: &str = "<default>";
const POLL: Duration = Duration::from_millis(100);
const INIT_RETRY: Duration = Duration::from_secs(1);

fn fail(message: &str) -> ! {
    eprintln!("interop-rust: {message}");
    std::process::exit(2);
}

fn required(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => fail(&format!("environment variable {name} is required")),
    }
}

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

fn init_logging() {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => v,
        _ if std::env::var_os("INTEROP_DEBUG").is_some() => "debug,h2=info,hyper=info".to_string(),
        _ => "warn".to_string(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

#[tokio::main]
async fn main() {
    init_logging();

    let host = required("FLAGD_HOST");
    let port_text = required("FLAGD_PORT");
    let port: u16 = port_text
        .parse()
        .unwrap_or_else(|_| fail(&format!("FLAGD_PORT is not a port: {port_text}")));
    let selector = std::env::var("FLAGD_SOURCE_SELECTOR")
        .ok()
        .filter(|s| !s.is_empty());
    let tls = std::env::var("FLAGD_TLS")
        .map(|v| v.trim().eq_ignore_ascii_case("true"))
        .unwrap_or(false);
    let cert_path = std::env::var("FLAGD_SERVER_CERT_PATH")
        .ok()
        .filter(|s| !s.is_empty());
    let flag_key = required("INTEROP_FLAG_KEY");
    let socket_path = std::env::var("INTEROP_SOCKET_PATH")
        .ok()
        .filter(|s| !s.is_empty());

    if tls
        && let Some(path) = &cert_path
        && !std::path::Path::new(path).is_file()
    {
        fail(&format!("FLAGD_SERVER_CERT_PATH does not exist: {path}"));
    }

    // Exit as soon as stdin reaches EOF (or fails), so a parent that goes away takes us down.
    tokio::spawn(async {
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdin.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        std::process::exit(0);
    });

    let options = FlagdOptions {
        resolver_type: ResolverType::InProcess,
        host,
        port,
        selector,
        tls,
        cert_path: if tls { cert_path } else { None },
        socket_path,
        // In-process evaluation reads the synced flag store directly; no result cache.
        cache_settings: None,
        ..FlagdOptions::default()
    };

    // `FlagdProvider::new` returns once the first flag configuration has arrived (it allows
    // 5 s for that). If it fails, try again: the server may not be up yet.
    let provider = loop {
        match FlagdProvider::new(options.clone()).await {
            Ok(p) => break p,
            Err(e) => {
                eprintln!("interop-rust: provider not ready yet: {e}");
                tokio::time::sleep(INIT_RETRY).await;
            }
        }
    };

    let client = {
        let mut api = OpenFeature::singleton_mut().await;
        api.set_provider(provider).await;
        api.create_client()
    };
    emit("READY");

    let mut last: Option<String> = None;
    let mut last_error: Option<String> = None;
    loop {
        let value = match client.get_string_value(&flag_key, None, None).await {
            Ok(v) => {
                last_error = None;
                v
            }
            Err(e) => {
                let text = format!("{e:?}");
                if last_error.as_deref() != Some(text.as_str()) {
                    eprintln!("interop-rust: evaluation of {flag_key} failed: {text}");
                    last_error = Some(text);
                }
                DEFAULT_VALUE.to_string()
            }
        };
        if last.as_deref() != Some(value.as_str()) {
            emit(&format!("VALUE {value}"));
            last = Some(value);
        }
        tokio::time::sleep(POLL).await;
    }
}
