//! The `flagd-proxy` command: parses the command line, sets up logging, turns the `start`
//! arguments into [`Settings`](flagd_proxy::settings::Settings) and runs the library's
//! [`app`](flagd_proxy::app) until a stop signal.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use anyhow::Context;
use flagd_proxy::app;
use flagd_proxy::cli::{CliError, Command, LogFormat, StartArgs, StatusArgs, StatusOutput};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// jemalloc, with its background thread (the `background_threads` feature): memory freed after
/// a burst of clients goes back to the system within seconds (its decay time), where the
/// system allocator kept it (72 of 78 MiB after 8,000 streams had gone; `measure_budgets` in
/// `tests/hostile.rs`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Exit status for a configuration that cannot work (sysexits' EX_USAGE).
const EXIT_CONFIG: u8 = 64;

fn main() -> ExitCode {
    let cli = match flagd_proxy::cli::parse_from(std::env::args_os()) {
        Ok(cli) => cli,
        Err(CliError::Clap(error)) if error.use_stderr() => {
            let _ = error.print();
            return ExitCode::from(EXIT_CONFIG);
        }
        Err(CliError::Clap(help)) => {
            let _ = help.print();
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("flagd-proxy: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match cli.command {
        Command::GenerateCliDocs => {
            print!("{}", flagd_proxy::cli::markdown());
            ExitCode::SUCCESS
        }
        Command::Start(args) => start(*args),
        Command::Status(args) => status(&args),
    }
}

/// Prints a running proxy's state; exits with status 1 when it cannot be read.
fn status(args: &StatusArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("flagd-proxy: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(flagd_proxy::status::fetch(&args.address)) {
        Ok(report) => {
            match args.output {
                StatusOutput::Table => print!("{}", report.to_table(std::time::SystemTime::now())),
                StatusOutput::Json => print!("{}", report.to_json()),
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("flagd-proxy: {error}");
            ExitCode::FAILURE
        }
    }
}

fn start(args: StartArgs) -> ExitCode {
    init_logging(args.log.log_format, args.log.debug);
    let settings = flagd_proxy::settings::Settings::from(args);
    // One TLS crypto provider for the sync port and the Kubernetes client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("flagd-proxy: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        // Before anything else, so that a signal during start-up is handled like any other:
        // SIGHUP and the like ignored, a stop signal stopping the proxy once it has started.
        let stop = listen_for_signals();
        let prepared = match app::prepare(settings).await {
            Ok(prepared) => prepared,
            Err(error) => {
                eprintln!("flagd-proxy: invalid configuration: {error}");
                return ExitCode::from(EXIT_CONFIG);
            }
        };
        // A port in use or a socket path that cannot be served: nothing listens yet.
        let bound = match prepared.bind().await {
            Ok(bound) => bound,
            Err(error) => {
                eprintln!("flagd-proxy: {error}");
                return ExitCode::from(EXIT_CONFIG);
            }
        };
        match serve(bound, stop).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("flagd-proxy: {error:#}");
                ExitCode::FAILURE
            }
        }
    })
}

async fn serve(bound: app::Bound, stop: StopSignals) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    tokio::spawn(stop.wait(shutdown.clone()));
    bound
        .run(shutdown)
        .await
        .context("flagd-proxy stopped with an error")
}

/// The signals that stop the proxy, listened for from the start.
struct StopSignals(Vec<(tokio::signal::unix::Signal, &'static str)>);

/// SIGTERM, SIGINT and SIGQUIT drain and stop the proxy ([`StopSignals::wait`]). SIGHUP, SIGUSR1
/// and SIGUSR2 are logged and otherwise ignored (the configuration is read once, at start; TLS
/// files and manifests are followed without a signal), so a supervisor's stray signal cannot
/// kill it. Installed first thing at start, so that no signal finds the default action (which
/// ends the process) in place.
fn listen_for_signals() -> StopSignals {
    use tokio::signal::unix::{SignalKind, signal};
    let listen = |kind: SignalKind, name: &'static str| match signal(kind) {
        Ok(signal) => Some((signal, name)),
        Err(error) => {
            tracing::warn!(%error, signal = name, "cannot listen for the signal");
            None
        }
    };
    let listen_all = |signals: [(SignalKind, &'static str); 3]| -> Vec<_> {
        signals
            .into_iter()
            .filter_map(|(kind, name)| listen(kind, name))
            .collect()
    };
    let stop = listen_all([
        (SignalKind::terminate(), "SIGTERM"),
        (SignalKind::interrupt(), "SIGINT"),
        (SignalKind::quit(), "SIGQUIT"),
    ]);
    let ignored = listen_all([
        (SignalKind::hangup(), "SIGHUP"),
        (SignalKind::user_defined1(), "SIGUSR1"),
        (SignalKind::user_defined2(), "SIGUSR2"),
    ]);
    tokio::spawn(async move {
        let mut ignored = futures::stream::select_all(ignored.into_iter().map(|(signal, name)| {
            tokio_stream::wrappers::SignalStream::new(signal).map(move |()| name)
        }));
        while let Some(name) = ignored.next().await {
            tracing::info!(
                signal = name,
                "signal received and ignored; the proxy keeps serving"
            );
        }
    });
    tracing::debug!("listening for signals");
    StopSignals(stop)
}

impl StopSignals {
    /// Waits for a stop signal (one received during start-up counts), then cancels `shutdown`.
    async fn wait(self, shutdown: CancellationToken) {
        let mut stop = futures::stream::select_all(self.0.into_iter().map(|(signal, name)| {
            tokio_stream::wrappers::SignalStream::new(signal).map(move |()| name)
        }));
        match stop.next().await {
            Some(name) => tracing::info!(signal = name, "signal received; shutting down"),
            // No stop signal can be received: serve until killed.
            None => futures::future::pending::<()>().await,
        }
        shutdown.cancel();
    }
}

fn init_logging(format: LogFormat, debug: bool) {
    // kube's client and watcher log every failed request; the proxy reports each state change
    // once itself (see the Kubernetes source), so they stay quiet unless asked for. With
    // --debug the HTTP/2 stack, TLS and the unix socket's HPACK decoder still log at info: at
    // debug they log every frame and table entry.
    let default = if debug {
        "debug,h2=info,hyper=info,tower=info,rustls=info,loona_hpack=info"
    } else {
        "info,kube_client::client::builder=off,kube_runtime::watcher=error"
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // Colours only for a person at a terminal, never in files or log collectors.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Console => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
