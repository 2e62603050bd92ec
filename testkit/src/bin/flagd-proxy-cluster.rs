//! The test cluster's lifecycle (`flagd_proxy_testkit::cluster`): a real single-node Kubernetes
//! cluster inside the network namespace `flagd-proxy-cluster`. Needs root.
//!
//! ```text
//! flagd-proxy-cluster run       take the machine-wide lock (printing WAITING first when another
//!                               cluster holds it, then LOCKED), start the cluster (removing what an
//!                               earlier run left first), print "READY <state dir>", then wait for
//!                               EOF on stdin or SIGINT/SIGTERM/SIGHUP and tear it all down
//! flagd-proxy-cluster down      remove what a killed run left (after a running cluster has ended)
//! flagd-proxy-cluster restart-apiserver   stop the running cluster's API server, start it again
//! flagd-proxy-cluster kubectl ARGS        kubectl as cluster admin, inside the namespace
//! flagd-proxy-cluster exec CMD ARGS       any command inside the namespace (curl to a pod IP)
//! flagd-proxy-cluster load TAR            import an OCI image archive into the node's containerd
//! flagd-proxy-cluster tag SRC DST         give an image in the node's containerd another name
//! flagd-proxy-cluster push TAR REF        push an OCI image archive to the registry (REF:
//!                                         name:tag; pods pull it as 10.99.0.1:5000/name:tag)
//! ```
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};
use flagd_proxy_testkit::cluster::layout::{LOCK, Layout, MachineLock, in_netns, log};
use flagd_proxy_testkit::cluster::node::Node;
use flagd_proxy_testkit::cluster::remove_all;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};

/// The request [`restart_apiserver`] sends to a running `run`.
const RESTART_APISERVER: &str = "restart-apiserver";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let layout = Layout::from_env();
    let result = match args.as_slice() {
        ["run"] => run(&layout).map(|()| ExitCode::SUCCESS),
        ["down"] => down(&layout).map(|()| ExitCode::SUCCESS),
        ["restart-apiserver"] => restart_apiserver(&layout).map(|()| ExitCode::SUCCESS),
        ["kubectl", rest @ ..] => {
            let mut kubectl = in_netns(layout.bins.join("kubectl"));
            kubectl
                .arg("--kubeconfig")
                .arg(layout.admin_kubeconfig())
                .args(rest);
            exit_code_of(&mut kubectl)
        }
        ["exec", program, rest @ ..] => exit_code_of(in_netns(program).args(rest)),
        ["load", archive] => layout.load(Path::new(archive)).map(|()| ExitCode::SUCCESS),
        ["tag", src, dst] => layout.tag(src, dst).map(|()| ExitCode::SUCCESS),
        ["push", archive, reference] => layout
            .push(Path::new(archive), reference)
            .map(|()| ExitCode::SUCCESS),
        _ => {
            eprintln!(
                "usage: flagd-proxy-cluster run|down|restart-apiserver|kubectl ARGS|exec CMD ARGS|\
                 load TAR|tag SRC DST|push TAR REF"
            );
            return ExitCode::from(2);
        }
    };
    result.unwrap_or_else(|error| {
        log(format_args!("error: {error:#}"));
        ExitCode::FAILURE
    })
}

fn exit_code_of(command: &mut std::process::Command) -> anyhow::Result<ExitCode> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    Ok(ExitCode::from(
        status
            .code()
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(1),
    ))
}

fn lock() -> anyhow::Result<MachineLock> {
    MachineLock::acquire(|| {
        log(format_args!(
            "waiting for another cluster on this machine to finish ({})",
            LOCK
        ));
        println!("WAITING");
        let _ = std::io::stdout().flush();
    })
}

fn down(layout: &Layout) -> anyhow::Result<()> {
    let _lock = lock()?;
    remove_all(layout);
    log(format_args!("down"));
    Ok(())
}

/// Up, READY, wait for EOF on stdin (the caller ended, however it ended) or a signal, down.
fn run(layout: &Layout) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the runtime")?;
    let result = {
        let _entered = runtime.enter();
        // From here on no signal ends this process before its teardown: each asks for it.
        let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT")?;
        let mut terminate = signal(SignalKind::terminate()).context("SIGTERM")?;
        let mut hangup = signal(SignalKind::hangup()).context("SIGHUP")?;
        let _lock = lock()?;
        println!("LOCKED");
        let _ = std::io::stdout().flush();
        let mut node = Node::up(layout.clone())?;
        let control = layout.control_socket();
        let listener = std::os::unix::net::UnixListener::bind(&control)
            .with_context(|| format!("listening on {}", control.display()))?;
        listener
            .set_nonblocking(true)
            .context("a non-blocking control socket")?;
        let listener =
            tokio::net::UnixListener::from_std(listener).context("the control socket")?;
        // The last line for the caller, who may stop reading: the rest goes to the log.
        println!("READY {}", layout.state.display());
        let _ = std::io::stdout().flush();
        runtime.block_on(async {
            let mut stdin = tokio::io::stdin();
            let eof = async {
                let mut buffer = [0u8; 256];
                while matches!(stdin.read(&mut buffer).await, Ok(n) if n > 0) {}
            };
            tokio::pin!(eof);
            loop {
                tokio::select! {
                    () = &mut eof => break log(format_args!("standard input closed")),
                    _ = interrupt.recv() => break log(format_args!("SIGINT")),
                    _ = terminate.recv() => break log(format_args!("SIGTERM")),
                    _ = hangup.recv() => break log(format_args!("SIGHUP")),
                    accepted = listener.accept() => {
                        if let Ok((stream, _)) = accepted {
                            serve_request(&mut node, stream).await;
                        }
                    }
                }
            }
        });
        // The node first (its teardown), then the lock.
        drop(node);
        Ok(())
    };
    // The standard-input reader may still be blocked in its read: do not wait for it.
    runtime.shutdown_background();
    result
}

async fn serve_request(node: &mut Node, stream: tokio::net::UnixStream) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    if tokio::io::BufReader::new(read)
        .read_line(&mut line)
        .await
        .is_err()
    {
        return;
    }
    let answer = match line.trim() {
        RESTART_APISERVER => match node.restart_apiserver() {
            Ok(()) => "ok".to_owned(),
            Err(error) => format!("error: {error:#}"),
        },
        other => format!("error: unknown request {other:?}"),
    };
    let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
}

/// Asks the running cluster to restart its API server; returns once it is ready again.
fn restart_apiserver(layout: &Layout) -> anyhow::Result<()> {
    let control = layout.control_socket();
    let mut stream = UnixStream::connect(&control)
        .with_context(|| format!("no running cluster answers on {}", control.display()))?;
    stream
        .write_all(format!("{RESTART_APISERVER}\n").as_bytes())
        .context("sending the request")?;
    let mut answer = String::new();
    BufReader::new(&mut stream)
        .read_line(&mut answer)
        .context("reading the answer")?;
    match answer.trim() {
        "ok" => Ok(()),
        "" => bail!("the cluster ended before answering"),
        error => bail!("{error}"),
    }
}
