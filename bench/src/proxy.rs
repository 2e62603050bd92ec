//! The proxies under test: this one, the Go flagd-proxy (or its model), and the floor, each a
//! process started for one scenario.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use flagd_proxy_testkit::control_plane::{ControlPlane, free_port};

use crate::args::Args;
use crate::floor;
use crate::load::BenchTls;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Rust,
    /// The Go flagd-proxy.
    Go,
    /// bench/go-fanout-model: a model of the Go proxy's fan-out, not the proxy.
    Model,
    /// The minimal writing server of floor.rs.
    Floor,
}

impl Kind {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Rust => "flagd-proxy (Rust)",
            Kind::Go => "Go flagd-proxy",
            Kind::Model => "Go fan-out model (not the Go proxy)",
            Kind::Floor => "floor",
        }
    }

    /// The label, with the Go proxy's column name as `--go-label` gives it.
    pub(crate) fn label_in(self, args: &Args) -> &str {
        match self {
            Kind::Go => &args.go_label,
            _ => self.label(),
        }
    }

    pub(crate) fn key(self) -> &'static str {
        match self {
            Kind::Rust => "rust",
            Kind::Go => "go",
            Kind::Model => "model",
            Kind::Floor => "floor",
        }
    }

    /// Reads the Go proxy's sources (`file:` selectors, `KUBECONFIG`).
    pub(crate) fn go_like(self) -> bool {
        matches!(self, Kind::Go | Kind::Model)
    }
}

/// A running proxy process, killed on drop.
pub(crate) struct ProxyProcess {
    pub(crate) child: Option<Child>,
    pub(crate) pid: u32,
    pub(crate) port: u16,
    pub(crate) management_port: u16,
    pub(crate) log: PathBuf,
    /// The floor server's standard input: the sequence numbers of new versions.
    pub(crate) control: Option<std::process::ChildStdin>,
}

impl ProxyProcess {
    /// Starts `bin` on free loopback ports, reading the manifests in `dir` (this proxy) or the
    /// `file:` selectors' files, or, with `cluster`, FeatureFlag resources on that API server
    /// (this proxy through its `--kube-*` flags, the Go proxy through `KUBECONFIG`).
    /// `extra` arguments are added for this proxy only.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        kind: Kind,
        bin: &Path,
        dir: &Path,
        cluster: Option<&ControlPlane>,
        tls: Option<&BenchTls>,
        payload: usize,
        watches: usize,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let management_port = free_port()?;
        let log = dir.join("proxy.log");
        let out = std::fs::File::create(&log)?;
        let mut command = Command::new(bin);
        if kind == Kind::Floor {
            command.args(floor::args(port, payload));
        } else {
            command
                .arg("start")
                .args(["--port", &port.to_string()])
                .args(["--management-port", &management_port.to_string()]);
        }
        match (kind, cluster) {
            (Kind::Rust, source) => {
                command.args(["--bind-address", "127.0.0.1"]);
                match source {
                    Some(cluster) => command.args(cluster.proxy_args(&[])),
                    None => command.arg("--manifests").arg(dir.join("manifests")),
                };
                // Every subscriber connects from 127.0.0.1; lift the per-address cap (a
                // production proxy sees one address per pod).
                command.args(["--max-connections-per-address", "0"]);
                // Room for every resource of the scenario, the new ones included.
                command.args(["--max-watches", &watches.max(10_000).to_string()]);
                if let Some(tls) = tls {
                    command
                        .arg("--server-cert-path")
                        .arg(&tls.cert)
                        .arg("--server-key-path")
                        .arg(&tls.key);
                }
                command.args(extra);
            }
            (Kind::Go | Kind::Model, Some(cluster)) => {
                command.env("KUBECONFIG", cluster.proxy_kubeconfig());
            }
            (Kind::Go | Kind::Model | Kind::Floor, _) => {}
        }
        command.stdin(if kind == Kind::Floor {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        Self::spawn(command, out, log, port, management_port)
    }

    /// Starts `bin start` on free loopback ports with only `args` added (this proxy's flags as
    /// given, every other setting its default), logging to `log`.
    pub(crate) fn launch(bin: &Path, args: &[String], log: PathBuf) -> anyhow::Result<Self> {
        Self::launch_as(Command::new(bin), args, log)
    }

    /// [`ProxyProcess::launch`] through `command`, which runs the proxy's binary (in a memory
    /// cgroup, for one).
    pub(crate) fn launch_as(
        mut command: Command,
        args: &[String],
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let management_port = free_port()?;
        let out = std::fs::File::create(&log)?;
        command
            .arg("start")
            .args(["--bind-address", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            .args(["--management-port", &management_port.to_string()])
            .args(args)
            .env_remove("FLAGD_PROXY_CONFIG")
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null());
        Self::spawn(command, out, log, port, management_port)
    }

    /// Spawns `command` with its output in `out` (the file at `log`).
    fn spawn(
        mut command: Command,
        out: std::fs::File,
        log: PathBuf,
        port: u16,
        management_port: u16,
    ) -> anyhow::Result<Self> {
        command.stdout(out.try_clone()?).stderr(out);
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {:?}", command.get_program()))?;
        Ok(Self {
            pid: child.id(),
            control: child.stdin.take(),
            child: Some(child),
            port,
            management_port,
            log,
        })
    }

    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// When the process has exited: how, and the end of its log (from its first `panic:` or
    /// `fatal error:` line when it has one, as a Go program that crashes writes, else its last
    /// four lines), on one line.
    pub(crate) fn exit_note(&mut self) -> Option<String> {
        let status = self.exited()?;
        let tail = self.log_tail();
        let lines: Vec<&str> = tail.lines().collect();
        let from = lines
            .iter()
            .position(|l| l.starts_with("panic:") || l.starts_with("fatal error:"))
            .unwrap_or(lines.len().saturating_sub(4));
        let end: Vec<&str> = lines[from..].iter().take(4).copied().collect();
        Some(format!(
            "the process exited ({status}). Its log ended: `{}`",
            end.join(" / ")
        ))
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for ProxyProcess {
    /// Asks the proxy to stop (SIGTERM, so profilers and the like can write their output) and
    /// kills it if it has not exited within ten seconds.
    fn drop(&mut self) {
        // The floor server ends when its input closes.
        drop(self.control.take());
        let Some(mut child) = self.child.take() else {
            return;
        };
        let asked = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if asked {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
