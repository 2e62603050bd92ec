//! Where the cluster keeps its state and how to reach it: the [`Layout`] (state and run
//! directories, binaries), the commands every user of the cluster runs inside its network
//! namespace (kubectl, ctr, crane), and the machine-wide [`MachineLock`].

use std::fmt;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

use super::names::{REGISTRY, netns_path};
use crate::control_plane::bin_dir;

/// The machine-wide lock: one cluster per machine.
pub const LOCK: &str = "/run/flagd-proxy-cluster.lock";

/// Writes one line to standard error, prefixed with the time of day (UTC).
pub fn log(message: fmt::Arguments<'_>) {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        % 86_400;
    eprintln!(
        "[cluster {:02}:{:02}:{:02}] {message}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    );
}

/// Where the cluster keeps its state, and the binaries it runs.
#[derive(Debug, Clone)]
pub struct Layout {
    /// PKI, kubeconfigs, logs, etcd, containerd and kubelet data:
    /// `$FLAGD_PROXY_CLUSTER_DIR`, else `/var/lib/flagd-proxy-cluster`.
    pub state: PathBuf,
    /// Sockets and containerd's runtime state (with the pods' network namespaces).
    pub run: PathBuf,
    /// The Kubernetes binaries, CoreDNS and crane ([`bin_dir`]).
    pub bins: PathBuf,
}

impl Layout {
    /// The layout every user of the cluster on this machine shares.
    pub fn from_env() -> Layout {
        let state = std::env::var_os("FLAGD_PROXY_CLUSTER_DIR")
            .filter(|dir| !dir.is_empty())
            .map_or_else(
                || PathBuf::from("/var/lib/flagd-proxy-cluster"),
                PathBuf::from,
            );
        Layout {
            state,
            run: PathBuf::from("/run/flagd-proxy-cluster"),
            bins: bin_dir(),
        }
    }

    /// The components' logs while the cluster runs.
    pub fn logs(&self) -> PathBuf {
        self.state.join("logs")
    }

    /// Where the last cluster's logs stay after its teardown.
    pub fn kept_logs(&self) -> PathBuf {
        let mut kept = self.state.clone().into_os_string();
        kept.push(".logs");
        PathBuf::from(kept)
    }

    /// The cluster admin's kubeconfig (valid inside the namespace).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.state.join("admin.kubeconfig")
    }

    /// The socket a running `flagd-proxy-cluster run` takes requests on.
    pub fn control_socket(&self) -> PathBuf {
        self.run.join("control.sock")
    }

    pub(crate) fn sysctls(&self) -> PathBuf {
        self.state.join("sysctl.saved")
    }

    pub(crate) fn containerd_socket(&self) -> PathBuf {
        self.run.join("containerd/containerd.sock")
    }

    /// kubectl as cluster admin, inside the namespace, with `input` on its standard input.
    pub fn kubectl(&self, args: &[&str], input: Option<&str>) -> anyhow::Result<String> {
        let mut command = in_netns(self.bins.join("kubectl"));
        command
            .arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(args);
        output(&mut command, input)
    }

    /// `ctr` on the node's containerd, in the namespace Kubernetes uses.
    pub fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut command = in_netns("ctr");
        command
            .arg("--address")
            .arg(self.containerd_socket())
            .args(["-n", "k8s.io"])
            .args(args);
        output(&mut command, None)
    }

    /// Imports an OCI image archive into the node's containerd.
    pub fn load(&self, archive: &Path) -> anyhow::Result<()> {
        let archive = archive.to_str().context("a UTF-8 archive path")?;
        self.ctr(&["images", "import", archive]).map(drop)
    }

    /// Gives the image `src` in the node's containerd the extra name `dst`.
    pub fn tag(&self, src: &str, dst: &str) -> anyhow::Result<()> {
        self.ctr(&["images", "tag", "--force", src, dst]).map(drop)
    }

    /// Pushes an OCI image archive to the in-cluster registry as `REGISTRY/<reference>`.
    pub fn push(&self, archive: &Path, reference: &str) -> anyhow::Result<()> {
        let layout = tempfile::tempdir().context("a folder for the image layout")?;
        output(
            Command::new("tar")
                .arg("-C")
                .arg(layout.path())
                .arg("-xf")
                .arg(archive),
            None,
        )?;
        let mut push = in_netns(self.bins.join("crane"));
        push.args(["push", "--insecure"])
            .arg(layout.path())
            .arg(format!("{REGISTRY}/{reference}"));
        output(&mut push, None).map(drop)
    }
}

/// `program` (arguments to follow) inside the cluster's network namespace.
pub fn in_netns(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new("nsenter");
    command
        .arg(format!("--net={}", netns_path().display()))
        .arg(program);
    command
}

/// Runs `command` with `input` on its standard input; its standard output, or an error with both
/// outputs when it fails.
pub(crate) fn output(command: &mut Command, input: Option<&str>) -> anyhow::Result<String> {
    let what = format!("{command:?}");
    let mut child = command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(input.as_bytes())
            .with_context(|| format!("writing to {what}"))?;
    }
    let out = child
        .wait_with_output()
        .with_context(|| format!("waiting for {what}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        bail!(
            "{what} failed ({}): {}{}",
            out.status,
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    }
}

/// The machine-wide cluster lock ([`LOCK`], flock), held until dropped.
pub struct MachineLock {
    _file: File,
}

impl MachineLock {
    /// Takes the lock, waiting for as long as another cluster on this machine holds it;
    /// `waiting` is called first when it has to wait.
    pub fn acquire(waiting: impl FnOnce()) -> anyhow::Result<MachineLock> {
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK)
            .with_context(|| format!("opening {LOCK}"))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                waiting();
                file.lock().with_context(|| format!("locking {LOCK}"))?;
            }
            Err(fs::TryLockError::Error(error)) => {
                return Err(error).with_context(|| format!("locking {LOCK}"));
            }
        }
        Ok(MachineLock { _file: file })
    }
}
