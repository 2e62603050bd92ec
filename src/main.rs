use std::process::ExitCode;

use anyhow::Context;
use flagd_proxy::app;
use flagd_proxy::cli::{CliError, Command, LogFormat, StartArgs};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

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
    }
}

fn start(args: StartArgs) -> ExitCode {
    init_logging(args.log_format, args.debug);
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
        let prepared = match app::prepare(args).await {
            Ok(prepared) => prepared,
            Err(error) => {
                eprintln!("flagd-proxy: invalid configuration: {error}");
                return ExitCode::from(EXIT_CONFIG);
            }
        };
        match serve(prepared).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("flagd-proxy: {error:#}");
                ExitCode::FAILURE
            }
        }
    })
}

async fn serve(prepared: app::Prepared) -> anyhow::Result<()> {
    let bound = prepared.bind().await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(wait_for_signal(shutdown.clone()));
    bound
        .run(shutdown)
        .await
        .context("flagd-proxy stopped with an error")
}

async fn wait_for_signal(shutdown: CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                futures::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
    shutdown.cancel();
}

fn init_logging(format: LogFormat, debug: bool) {
    // kube's client and watcher log every failed request; the proxy reports each state change
    // once itself (see the Kubernetes source), so they stay quiet unless asked for.
    let default = if debug {
        "debug,h2=info,hyper=info,tower=info,rustls=info"
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
