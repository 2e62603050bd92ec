//! The `flagd-proxy` command: parses the command line, sets up logging, turns the `start`
//! arguments into [`Settings`](flagd_proxy::settings::Settings) and runs the library's
//! [`app`](flagd_proxy::app) until a stop signal.
#![deny(unsafe_code)]

use std::process::ExitCode;

use anyhow::Context;
use flagd_proxy::app;
use flagd_proxy::cli::{CliError, Command, LogFormat, StartArgs, StatusArgs, StatusOutput};
use flagd_proxy::signals::{self, EarlySignals, StopSignals};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// jemalloc, with its background thread (the `background_threads` feature): memory freed after
/// a burst of clients goes back to the system within seconds (its decay time), where the
/// system allocator kept it (72 of 78 MiB after 8,000 streams had gone; `measure_budgets` in
/// `tests/hostile.rs`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The allocator's handling of freed memory.
mod allocator {
    /// Makes jemalloc give freed pages back to the system at once, in every arena and in those
    /// to come, rather than keeping them for 10 s (its default dirty decay) to reuse. Under a
    /// small memory limit what the arenas keep is what would kill the process: up to 50 MiB
    /// of freed pages after start-up and 24 large resources were delivered
    /// (`a_version_asked_for_in_every_form_is_held_once` in `tests/compression.rs`), more than
    /// the node tier's 64 MiB limit leaves above its budget. A failure is logged, not fatal:
    /// the proxy works, with more memory kept.
    pub(super) fn return_freed_pages_at_once() {
        let arenas = match tikv_jemalloc_ctl::arenas::narenas::read() {
            Ok(arenas) => arenas,
            Err(error) => return tracing::warn!(%error, "cannot read the allocator's arenas"),
        };
        let names = std::iter::once("arenas.dirty_decay_ms\0".to_owned())
            .chain((0..arenas).map(|arena| format!("arena.{arena}.dirty_decay_ms\0")));
        for name in names {
            // SAFETY: each name is a jemalloc control of type `ssize_t`, written with an
            // `isize`; an arena not yet created refuses the write (it gets the default for new
            // arenas, written first).
            #[allow(unsafe_code)]
            let written = unsafe { tikv_jemalloc_ctl::raw::write(name.as_bytes(), 0_isize) };
            if let Err(error) = written
                && name.starts_with("arenas.")
            {
                tracing::warn!(%error, "cannot make the allocator give freed memory back at once");
            }
        }
    }
}

/// Exit status for a configuration that cannot work (sysexits' EX_USAGE).
const EXIT_CONFIG: u8 = 64;

fn main() -> ExitCode {
    // First of all, before the command line (and so the config file) is read: a signal that
    // finds its default action in place ends the process.
    let signals = EarlySignals::install();
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
            complain(format_args!("{error}"));
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match cli.command {
        Command::GenerateCliDocs => {
            signals.restore_defaults();
            print_out(&flagd_proxy::cli::markdown())
        }
        Command::Start(args) => start(*args, signals),
        Command::Status(args) => {
            signals.restore_defaults();
            status(&args)
        }
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
            complain(format_args!("cannot start the async runtime: {error}"));
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(flagd_proxy::status::fetch(&args.address)) {
        Ok(report) => print_out(&match args.output {
            StatusOutput::Table => report.to_table(std::time::SystemTime::now()),
            StatusOutput::Json => report.to_json(),
        }),
        Err(error) => {
            // The error may quote what the peer sent.
            let message = flagd_proxy::text::escaped(&error.to_string()).into_owned();
            complain(format_args!("{message}"));
            ExitCode::FAILURE
        }
    }
}

fn start(args: StartArgs, signals: EarlySignals) -> ExitCode {
    init_logging(args.log.log_format, args.log.debug);
    let settings = flagd_proxy::settings::Settings::from(args);
    if flagd_proxy::budget::is_tight(settings.memory.budget) {
        allocator::return_freed_pages_at_once();
    }
    // One TLS crypto provider for the sync port and the Kubernetes client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Blocking threads (manifest parses, state-directory writes) go two seconds after their
    // last task rather than Tokio's ten: a burst of edits does not leave its threads behind.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            complain(format_args!("cannot start the async runtime: {error}"));
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async move {
        // Before anything else in the runtime: the signals caught since `main` began, and
        // those to come, are handled from here on.
        let stop = signals::listen(signals);
        let prepared = match app::prepare(settings).await {
            Ok(prepared) => prepared,
            Err(error) => {
                complain(format_args!("invalid configuration: {error}"));
                return ExitCode::from(EXIT_CONFIG);
            }
        };
        // A port in use or a socket path that cannot be served: nothing listens yet.
        let bound = match prepared.bind().await {
            Ok(bound) => bound,
            Err(error) => {
                complain(format_args!("{error}"));
                return ExitCode::from(EXIT_CONFIG);
            }
        };
        match serve(bound, stop).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                complain(format_args!("{error:#}"));
                ExitCode::FAILURE
            }
        }
    });
    // Work still on the blocking threads (a manifest parse, a directory scan) is not waited
    // for past this: dropping the runtime would wait for it however long it takes.
    runtime.shutdown_timeout(EXIT_GRACE);
    code
}

/// Says what went wrong on stderr, prefixed with the command's name. A message that cannot be
/// written (stderr's reader went away) is dropped: `eprintln!` would panic and turn the exit
/// status into 101.
fn complain(message: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "flagd-proxy: {message}");
}

/// Writes a command's output to stdout. A reader that stops early (`| head`) is not an error:
/// the command ends with status 0, as when everything was read. Any other write error (a full
/// disk) loses output: it is said on stderr, with status 1. (`print!` panics on both.)
fn print_out(text: &str) -> ExitCode {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(error) => {
            complain(format_args!("cannot write the output: {error}"));
            ExitCode::FAILURE
        }
    }
}

/// How long an idle blocking thread of the runtime stays.
const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long the exit waits for work left on the runtime's blocking threads.
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

async fn serve(bound: app::Bound, stop: StopSignals) -> anyhow::Result<()> {
    let (shutdown, hurry) = (CancellationToken::new(), CancellationToken::new());
    tokio::spawn(stop.wait(shutdown.clone(), hurry.clone()));
    bound
        .run(shutdown, hurry)
        .await
        .context("flagd-proxy stopped with an error")
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
    // A line that cannot be written (the log pipe's reader went away) is dropped. Reporting it
    // on that same stderr would panic (`eprintln!`), and a panic in the signal task would leave
    // a proxy that no stop signal ends.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_ansi(ansi);
    match format {
        LogFormat::Console => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
