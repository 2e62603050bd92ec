//! The signals the proxy acts on, caught from the first statement of `main`.
//!
//! SIGTERM, SIGINT and SIGQUIT drain and stop the proxy (a second one ends the drain at once); SIGHUP, SIGUSR1 and SIGUSR2 are logged
//! and otherwise ignored (the configuration is read once, at start; TLS files and manifests are
//! followed without a signal), so that a supervisor's stray signal cannot kill it. The default
//! action of all six ends the process, so they are caught by [`EarlySignals::install`] before
//! the command line is read, the config file opened, logging set up or the async runtime
//! started: a reload signal during start-up is ignored, and a stop signal received then stops
//! the proxy as soon as it has started. A signal that arrives before `main` runs (while the
//! process is being created and loaded) still finds the default action: nothing in the program
//! can be in place that early.
//!
//! Once the runtime runs, [`listen`] takes over with tokio's listeners. The other commands
//! (`status`, the documentation generator) get the default actions back with
//! [`EarlySignals::restore_defaults`].
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use signal_hook::consts::signal::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// What a signal does to a running proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    Stop,
    Ignore,
}

/// A signal the proxy acts on: its number, its name, tokio's kind of it, what it does.
type Handled = (i32, &'static str, fn() -> SignalKind, Effect);

/// The signals the proxy acts on.
const SIGNALS: [Handled; 6] = [
    (SIGTERM, "SIGTERM", SignalKind::terminate, Effect::Stop),
    (SIGINT, "SIGINT", SignalKind::interrupt, Effect::Stop),
    (SIGQUIT, "SIGQUIT", SignalKind::quit, Effect::Stop),
    (SIGHUP, "SIGHUP", SignalKind::hangup, Effect::Ignore),
    (
        SIGUSR1,
        "SIGUSR1",
        SignalKind::user_defined1,
        Effect::Ignore,
    ),
    (
        SIGUSR2,
        "SIGUSR2",
        SignalKind::user_defined2,
        Effect::Ignore,
    ),
];

/// The signals caught before the runtime starts: each one's flag is raised when it arrives.
pub struct EarlySignals {
    /// Raised by each signal of [`SIGNALS`], in that order.
    received: Vec<Arc<AtomicBool>>,
    /// When raised, a signal takes its default action (the commands other than `start`).
    default_action: Arc<AtomicBool>,
    /// The signals that could not be caught, with why (logged once logging is set up).
    failed: Vec<(&'static str, std::io::Error)>,
}

impl EarlySignals {
    /// Catches the six signals: from now on each only raises its flag. Async-signal-safe
    /// handlers; tokio's, installed later, run beside them.
    pub fn install() -> Self {
        let default_action = Arc::new(AtomicBool::new(false));
        let mut received = Vec::with_capacity(SIGNALS.len());
        let mut failed = Vec::new();
        for (number, name, _, _) in SIGNALS {
            let flag = Arc::new(AtomicBool::new(false));
            let caught = signal_hook::flag::register(number, flag.clone()).and_then(|_| {
                signal_hook::flag::register_conditional_default(number, default_action.clone())
            });
            if let Err(error) = caught {
                failed.push((name, error));
            }
            received.push(flag);
        }
        Self {
            received,
            default_action,
            failed,
        }
    }

    /// For the commands that do not serve: every signal takes its default action again (which
    /// ends the process), and one received since [`install`](Self::install) takes it now.
    pub fn restore_defaults(self) {
        self.default_action.store(true, Ordering::SeqCst);
        for ((number, ..), flag) in SIGNALS.iter().zip(&self.received) {
            if flag.load(Ordering::SeqCst) {
                let _ = signal_hook::low_level::emulate_default_handler(*number);
            }
        }
    }

    /// The names of the signals received so far with `effect`, their flags lowered.
    fn take(&self, effect: Effect) -> Vec<&'static str> {
        SIGNALS
            .iter()
            .zip(&self.received)
            .filter(|((.., e), flag)| *e == effect && flag.swap(false, Ordering::SeqCst))
            .map(|((_, name, ..), _)| *name)
            .collect()
    }
}

/// The stop signals, listened for from the start (see [`StopSignals::wait`]).
pub struct StopSignals {
    early: EarlySignals,
    listening: Vec<(Signal, &'static str)>,
}

/// Listens for the six signals with tokio (inside the runtime) and logs the reload signals as
/// they come, those received before included; the stop signals are for [`StopSignals::wait`].
pub fn listen(early: EarlySignals) -> StopSignals {
    for (name, error) in &early.failed {
        tracing::warn!(%error, signal = name, "cannot catch the signal before start-up");
    }
    let mut stop = Vec::new();
    let mut ignored = Vec::new();
    for (_, name, kind, effect) in SIGNALS {
        match (signal(kind()), effect) {
            (Ok(signal), Effect::Stop) => stop.push((signal, name)),
            (Ok(signal), Effect::Ignore) => ignored.push((signal, name)),
            (Err(error), _) => {
                tracing::warn!(%error, signal = name, "cannot listen for the signal");
            }
        }
    }
    tracing::debug!("listening for signals");
    // After tokio's listeners: a signal is either in a flag here or seen by them (or both).
    for name in early.take(Effect::Ignore) {
        tracing::info!(
            signal = name,
            "signal received during start-up and ignored; the proxy goes on"
        );
    }
    tokio::spawn(async move {
        let mut ignored = merged(ignored);
        while let Some(name) = ignored.next().await {
            tracing::info!(
                signal = name,
                "signal received and ignored; the proxy keeps serving"
            );
        }
    });
    StopSignals {
        early,
        listening: stop,
    }
}

/// One stream of the names of the signals as they arrive.
fn merged(signals: Vec<(Signal, &'static str)>) -> impl futures::Stream<Item = &'static str> {
    futures::stream::select_all(signals.into_iter().map(|(signal, name)| {
        tokio_stream::wrappers::SignalStream::new(signal).map(move |()| name)
    }))
}

impl StopSignals {
    /// Waits for a stop signal (one received during start-up counts), then cancels `shutdown`;
    /// a second stop signal then cancels `hurry` (the drain ends at once).
    pub async fn wait(self, shutdown: CancellationToken, hurry: CancellationToken) {
        let early = self.early.take(Effect::Stop);
        let mut listening = merged(self.listening);
        let name = match early.first() {
            Some(name) => Some(*name),
            None => listening.next().await,
        };
        let Some(name) = name else {
            // No stop signal can be received: serve until killed.
            return futures::future::pending::<()>().await;
        };
        tracing::info!(signal = name, "signal received; shutting down");
        shutdown.cancel();
        let second = match early.get(1) {
            Some(name) => Some(*name),
            None => listening.next().await,
        };
        if let Some(name) = second {
            tracing::info!(signal = name, "second stop signal; ending the drain now");
            hurry.cancel();
        }
    }
}
