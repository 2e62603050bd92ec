//! A real single-node Kubernetes cluster for the tests of one test binary: the
//! `flagd-proxy-cluster` binary of this package (`run`) brings it up inside its own network
//! namespace (etcd, kube-apiserver, controller-manager, scheduler, containerd, kubelet, bridge
//! CNI, kube-proxy, CoreDNS and an image registry; [`node`]), and tears it down when its standard
//! input closes, which happens when the test process exits however it exits (a panic, a signal).
//! It runs in a process group of its own, so a Ctrl-C meant for the tests does not cut its
//! teardown short. A run that was killed outright leaves state that the next run's start removes
//! first. It holds the machine-wide lock `/run/flagd-proxy-cluster.lock` from before the start
//! until its teardown is done: a second cluster (another test process, a CI run, a cluster
//! started by hand) waits for the first, logging that it waits.
//!
//! The test process reaches the cluster only through commands run inside that namespace
//! (`nsenter --net`): kubectl as cluster admin, curl to pod IPs. Nothing of the cluster is reachable
//! from, or reaches, any other address.
//!
//! Without what the cluster needs (root, the Debian packages, the Go binaries) the tests print a
//! notice naming what is missing and pass, unless `CI` is set: then they fail.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::ops::Deref;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, mpsc};
use std::time::{Duration, Instant};

use super::control_plane::{bin_dir, cache_dir, test_data};

mod config;
pub mod layout;
mod names;
pub mod node;
mod teardown;

pub use self::names::{NETNS, REGISTRY};
pub use self::teardown::remove_all;
use layout::Layout;

/// Bound for one cluster event (a rollout, a pull, a sync), guarding only against hangs.
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(240);
/// How long a kubectl call waits for an API server that cannot be reached.
pub const API_SERVER_ABSENCE: Duration = Duration::from_secs(90);
/// The proxy image every scenario runs, made from the binary under test.
pub const PROXY_IMAGE: &str = "flagd-proxy";
pub const PROXY_TAG: &str = "test";
/// flagd, from the pinned build of scripts/install-compat.sh.
pub const FLAGD_IMAGE: &str = "flagd";
pub const FLAGD_TAG: &str = "v0.16.0";

/// The running cluster. There is one per test process; see [`cluster_or_skip`].
pub struct Cluster {
    dir: PathBuf,
    layout: Layout,
    /// `flagd-proxy-cluster`, which runs the cluster.
    binary: PathBuf,
    kubectl: PathBuf,
    /// Closing this (the process exits) tells `flagd-proxy-cluster run` to tear down.
    _keepalive: Mutex<ChildStdin>,
    images: Mutex<BTreeSet<String>>,
    crds: OnceLock<()>,
}

static CLUSTER: OnceLock<Result<Cluster, Unavailable>> = OnceLock::new();

/// The tests of a process share its cluster, each in namespaces of its own; a test that disrupts
/// the cluster itself (restarts the API server, breaks the node's network) holds it alone. Shared
/// users hold the read side for their whole test, a disruptive one the write side.
static TURNS: RwLock<()> = RwLock::new(());

/// The cluster while a test holds `Turn`, its side of [`TURNS`].
pub struct HeldCluster<Turn> {
    cluster: &'static Cluster,
    _turn: Turn,
}

impl<Turn> Deref for HeldCluster<Turn> {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        self.cluster
    }
}

/// The cluster, shared with the other tests of the process: nothing disrupts it meanwhile.
pub type SharedCluster = HeldCluster<RwLockReadGuard<'static, ()>>;

/// The cluster with no other test using it: only this may disrupt it.
pub type ExclusiveCluster = HeldCluster<RwLockWriteGuard<'static, ()>>;

impl ExclusiveCluster {
    /// Stops the API server and starts it again (`flagd-proxy-cluster restart-apiserver`);
    /// returns once it is ready.
    pub fn restart_apiserver(&self) {
        run_ok(
            Command::new(&self.binary).arg("restart-apiserver"),
            "flagd-proxy-cluster restart-apiserver",
        );
    }
}

/// Why there is no cluster.
#[derive(Debug, Clone)]
pub enum Unavailable {
    /// Something the cluster needs is not installed on this machine.
    Missing(Vec<String>),
    /// Everything is there but the cluster did not come up.
    Failed(String),
}

fn repo_root() -> PathBuf {
    crate::repo_root()
}

/// Runs `scripts/build-image.sh` on the binary under test (stripped), writing the image archive
/// `archive` named `reference`; returns the manifest digest it prints.
pub fn build_proxy_image(archive: &Path, reference: &str) -> String {
    let output = run_ok(
        Command::new(repo_root().join("scripts/build-image.sh"))
            .arg(archive)
            .arg(reference)
            .env("BINARY", crate::proxy_bin())
            .env("STRIP", "1"),
        "scripts/build-image.sh",
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// What this machine lacks for a cluster, each with where it comes from.
pub fn missing_dependencies() -> Vec<String> {
    let mut missing = Vec::new();
    if !crate::skip::running_as_root() {
        missing
            .push("root (the cluster creates a network namespace, mounts and cgroups)".to_owned());
    }
    let bins = bin_dir();
    for name in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
        "kube-proxy",
        "kubectl",
    ] {
        if !bins.join(name).is_file() {
            missing.push(format!(
                "{} (scripts/build-control-plane.sh)",
                bins.join(name).display()
            ));
        }
    }
    for name in ["coredns", "crane"] {
        if !bins.join(name).is_file() {
            missing.push(format!(
                "{} (scripts/build-cluster-tools.sh)",
                bins.join(name).display()
            ));
        }
    }
    for (path, package) in [
        ("/usr/bin/containerd", "containerd"),
        ("/usr/bin/ctr", "containerd"),
        ("/usr/sbin/runc", "runc"),
        ("/usr/lib/cni/bridge", "containernetworking-plugins"),
        ("/usr/lib/cni/host-local", "containernetworking-plugins"),
        ("/usr/sbin/iptables", "iptables"),
        ("/usr/sbin/conntrack", "conntrack"),
        ("/bin/busybox", "busybox-static"),
        ("/usr/bin/nsenter", "util-linux"),
        ("/usr/bin/curl", "curl"),
    ] {
        if !Path::new(path).exists() {
            missing.push(format!(
                "{path} (Debian package {package}; scripts/build-cluster-tools.sh)"
            ));
        }
    }
    if !Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists() {
        missing.push("the kernel's br_netfilter (bridge-nf-call-iptables)".to_owned());
    }
    missing
}

/// The cluster, started on first use, shared with the other tests of this process until the
/// returned value is dropped; a test that disrupts the cluster waits meanwhile. When something it
/// needs is missing this panics if `CI` is set and otherwise prints a notice and returns `None`.
/// A cluster that fails to start panics.
pub fn cluster_or_skip() -> Option<SharedCluster> {
    held_cluster(|| TURNS.read().unwrap_or_else(PoisonError::into_inner))
}

/// Like [`cluster_or_skip`], but once every other test of this process has given the cluster up
/// and until the returned value is dropped: for a test that disrupts the cluster itself.
pub fn exclusive_cluster_or_skip() -> Option<ExclusiveCluster> {
    held_cluster(|| TURNS.write().unwrap_or_else(PoisonError::into_inner))
}

/// The started cluster (or `None` after a skip), once `take_turn` has taken this test's turn.
fn held_cluster<Turn>(take_turn: impl FnOnce() -> Turn) -> Option<HeldCluster<Turn>> {
    let cluster = started_cluster()?;
    Some(HeldCluster {
        cluster,
        _turn: take_turn(),
    })
}

fn started_cluster() -> Option<&'static Cluster> {
    let result = CLUSTER.get_or_init(|| {
        let missing = missing_dependencies();
        if missing.is_empty() {
            Cluster::start().map_err(Unavailable::Failed)
        } else {
            Err(Unavailable::Missing(missing))
        }
    });
    match result {
        Ok(cluster) => Some(cluster),
        Err(Unavailable::Missing(missing)) => {
            crate::skip::skip(format_args!("no cluster, missing: {}", missing.join("; ")));
            None
        }
        Err(Unavailable::Failed(error)) => panic!("the cluster did not start: {error}"),
    }
}

/// The OpenFeature Operator's manager binary (v0.9.2; no module proxy serves its module, so it
/// is not built here): `$FLAGD_PROXY_OPERATOR_BIN`, else `<cache>/bin/open-feature-operator`, else
/// the optional peer-binary folder `shared/bin` beside the repository. `None` after a recorded
/// skip when absent, under `CI` too ([`crate::skip::skip_without_peer`]).
pub fn operator_binary() -> Option<PathBuf> {
    let candidates = match std::env::var_os("FLAGD_PROXY_OPERATOR_BIN") {
        Some(path) if !path.is_empty() => vec![PathBuf::from(path)],
        _ => vec![
            bin_dir().join("open-feature-operator"),
            crate::repo_root().join("../shared/bin/open-feature-operator"),
        ],
    };
    let found = candidates.iter().find(|p| p.is_file()).cloned();
    if found.is_none() {
        crate::skip::skip_without_peer(format_args!(
            "{} is missing (the OpenFeature Operator manager v0.9.2, a peer binary: put it in the \
             cache's bin folder, in ../shared/bin beside the repository, or set \
             FLAGD_PROXY_OPERATOR_BIN)",
            candidates[0].display()
        ));
    }
    found
}

/// A peer binary or pinned build a scenario needs: `None` (with a notice) when it is missing,
/// a panic under `CI`.
pub fn required_file(path: &Path, how: &str) -> Option<PathBuf> {
    if path.is_file() {
        return Some(path.to_path_buf());
    }
    crate::skip::skip(format_args!("{} is missing ({how})", path.display()));
    None
}

impl Cluster {
    fn start() -> Result<Cluster, String> {
        let log_dir = cache_dir().join("logs");
        std::fs::create_dir_all(&log_dir)
            .map_err(|e| format!("create {}: {e}", log_dir.display()))?;
        let log_path = log_dir.join("cluster.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| format!("create {}: {e}", log_path.display()))?;
        let binary = cluster_binary()?;
        let mut child = Command::new(&binary)
            .arg("run")
            .env("FLAGD_PROXY_KUBE_BIN_DIR", bin_dir())
            // Not in the test's process group: a Ctrl-C there does not reach it (its stdin
            // closing does).
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("run {}: {e}", binary.display()))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(dir) = line.strip_prefix("READY ") {
                    let _ = tx.send(Some(PathBuf::from(dir)));
                } else if line == "WAITING" {
                    // It waits (without bound) for the machine-wide lock
                    // /run/flagd-proxy-cluster.lock: one cluster per machine.
                    eprintln!("waiting for another cluster on this machine to finish");
                } else if line == "LOCKED" {
                    let _ = tx.send(Some(PathBuf::new()));
                }
            }
            let _ = tx.send(None);
        });
        let tail = || {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        // First the lock, held by `flagd-proxy-cluster run` until its teardown is done (so also
        // after a panic here: closing its stdin starts the teardown), however long another
        // cluster on this machine takes; then the cluster, within a bound.
        let locked = matches!(rx.recv(), Ok(Some(dir)) if dir.as_os_str().is_empty());
        let ready = if locked {
            rx.recv_timeout(Duration::from_secs(600)).ok().flatten()
        } else {
            None
        };
        let dir = match ready {
            Some(dir) => dir,
            None => {
                return Err(format!(
                    "flagd-proxy-cluster run did not report READY; {}:\n{}",
                    log_path.display(),
                    tail()
                ));
            }
        };
        eprintln!("cluster up: {} (log {})", dir.display(), log_path.display());
        Ok(Cluster {
            dir,
            layout: Layout::from_env(),
            binary,
            kubectl: bin_dir().join("kubectl"),
            _keepalive: Mutex::new(stdin),
            images: Mutex::new(BTreeSet::new()),
            crds: OnceLock::new(),
        })
    }

    /// The cluster's state directory (PKI, kubeconfigs, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs a command inside the cluster's network namespace, with `input` on its stdin.
    pub fn exec_with_input(&self, args: &[&str], input: Option<&str>) -> Result<String, String> {
        let (program, rest) = args.split_first().ok_or("no command to run")?;
        let mut command = layout::in_netns(program);
        command.args(rest);
        layout::output(&mut command, input).map_err(|e| format!("{e:#}"))
    }

    /// Runs a command inside the cluster's network namespace.
    pub fn exec(&self, args: &[&str]) -> Result<String, String> {
        self.exec_with_input(args, None)
    }

    fn kubectl_args<'a>(&'a self, kubeconfig: &'a str, args: &[&'a str]) -> Vec<&'a str> {
        let mut all = vec![
            self.kubectl.to_str().unwrap_or("kubectl"),
            "--kubeconfig",
            kubeconfig,
        ];
        all.extend_from_slice(args);
        all
    }

    /// kubectl as cluster admin. A call that cannot reach the API server (it is briefly away: a
    /// restart, a connection cut) is made again, for up to [`API_SERVER_ABSENCE`]; any answer of
    /// the server, an error included, is returned as it is.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_with_input(args, None)
    }

    /// `kubectl apply -f -` of `manifest` (YAML or JSON); panics on failure.
    pub fn apply(&self, manifest: &str) {
        if let Err(error) = self.kubectl_with_input(&["apply", "-f", "-"], Some(manifest)) {
            panic!("kubectl apply: {error}\n{manifest}");
        }
    }

    fn kubectl_with_input(&self, args: &[&str], input: Option<&str>) -> Result<String, String> {
        let kubeconfig = self.kubeconfig();
        let args = self.kubectl_args(&kubeconfig, args);
        let deadline = Instant::now() + API_SERVER_ABSENCE;
        loop {
            match self.exec_with_input(&args, input) {
                Err(error) if api_server_unreachable(&error) && Instant::now() < deadline => {
                    eprintln!("the API server is away, trying again: {error}");
                    std::thread::sleep(Duration::from_secs(1));
                }
                result => return result,
            }
        }
    }

    /// The admin kubeconfig (valid inside the namespace).
    pub fn kubeconfig(&self) -> String {
        self.dir.join("admin.kubeconfig").display().to_string()
    }

    /// A namespace whose pods must meet the `restricted` Pod Security Standard.
    pub fn restricted_namespace(&self, name: &str) {
        self.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:\n    \
             pod-security.kubernetes.io/enforce: restricted\n    \
             pod-security.kubernetes.io/enforce-version: latest\n"
        ));
    }

    /// The OpenFeature Operator's CRDs (from the pinned module download), applied once and
    /// established.
    pub fn install_crds(&self) {
        self.crds.get_or_init(|| {
            let dir =
                test_data("open-feature-operator/config/crd/bases").unwrap_or_else(|missing| {
                    panic!("{missing}");
                });
            let dir = dir.display().to_string();
            self.kubectl(&["apply", "--server-side", "-f", &dir])
                .unwrap_or_else(|e| panic!("apply CRDs: {e}"));
            self.kubectl(&[
                "wait",
                "--for=condition=Established",
                "--timeout=120s",
                "-f",
                &dir,
            ])
            .unwrap_or_else(|e| panic!("CRDs established: {e}"));
        });
    }

    /// GETs `url` from inside the namespace (curl); the body on a 2xx answer.
    pub fn http_get(&self, url: &str) -> Result<String, String> {
        self.exec(&["curl", "-sS", "--fail", "--max-time", "5", url])
    }

    /// POSTs JSON `body` to `url` from inside the namespace (curl); the body on a 2xx answer.
    pub fn http_post_json(&self, url: &str, body: &str) -> Result<String, String> {
        self.exec(&[
            "curl",
            "-sS",
            "--fail",
            "--max-time",
            "5",
            "-H",
            "Content-Type: application/json",
            "--data",
            body,
            url,
        ])
    }

    /// Pod IPs of the Running pods in `ns` matching `selector`.
    pub fn pod_ips(&self, ns: &str, selector: &str) -> Result<Vec<String>, String> {
        let out = self.kubectl(&[
            "-n",
            ns,
            "get",
            "pods",
            "-l",
            selector,
            "--field-selector=status.phase=Running",
            "-o",
            "jsonpath={range .items[*]}{.status.podIP}{\"\\n\"}{end}",
        ])?;
        Ok(out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect())
    }

    /// Waits until `kubectl rollout status` reports the Deployment `ns/name` complete.
    pub fn wait_rollout(&self, ns: &str, name: &str) {
        let deployment = format!("deployment/{name}");
        wait_for(&format!("rollout of {ns}/{name}"), CLUSTER_TIMEOUT, || {
            self.kubectl(&["-n", ns, "rollout", "status", &deployment, "--timeout=20s"])
        })
        .map(|_| ())
        .unwrap_or_else(|error| {
            let pods = self
                .kubectl(&["-n", ns, "get", "pods", "-o", "wide"])
                .unwrap_or_default();
            let events = self
                .kubectl(&["-n", ns, "get", "events", "--sort-by=.lastTimestamp"])
                .unwrap_or_default();
            panic!("{error}\npods:\n{pods}\nevents:\n{events}");
        });
    }

    /// Gives the image `src` in the node's containerd the extra name `dst`.
    pub fn tag_image(&self, src: &str, dst: &str) {
        if let Err(error) = self.layout.tag(src, dst) {
            panic!("tag {src} as {dst}: {error:#}");
        }
    }

    /// Imports an OCI archive into the node's containerd and pushes it to the in-cluster
    /// registry as `REGISTRY/<name>:<tag>`. Idempotent per `name:tag`.
    pub fn publish_image(&self, archive: &Path, name: &str, tag: &str) {
        let key = format!("{name}:{tag}");
        let mut images = self.images.lock().unwrap_or_else(|e| e.into_inner());
        if images.contains(&key) {
            return;
        }
        if let Err(error) = self.layout.load(archive) {
            panic!("load {}: {error:#}", archive.display());
        }
        if let Err(error) = self.layout.push(archive, &key) {
            panic!("push {} as {key}: {error:#}", archive.display());
        }
        images.insert(key);
    }

    /// The proxy image, built from the binary under test and published as
    /// `REGISTRY/flagd-proxy:test` (also imported into containerd as `localhost/flagd-proxy:test`).
    pub fn proxy_image(&self) -> String {
        let archive = crate::target_tmpdir().join("cluster-images/flagd-proxy.tar");
        let mut images = self.images.lock().unwrap_or_else(|e| e.into_inner());
        if !images.contains("built:flagd-proxy") {
            build_proxy_image(&archive, &format!("localhost/{PROXY_IMAGE}:{PROXY_TAG}"));
            images.insert("built:flagd-proxy".to_owned());
        }
        drop(images);
        self.publish_image(&archive, PROXY_IMAGE, PROXY_TAG);
        format!("{REGISTRY}/{PROXY_IMAGE}:{PROXY_TAG}")
    }

    /// The flagd image (the pinned build of scripts/install-compat.sh), published as
    /// `REGISTRY/flagd:v0.16.0`; `None` (or a panic under `CI`) when that build is missing.
    pub fn flagd_image(&self) -> Option<String> {
        let flagd = required_file(
            &bin_dir().join(format!("flagd-{FLAGD_TAG}/flagd")),
            "scripts/install-compat.sh builds it",
        )?;
        Some(self.binary_image(&flagd, FLAGD_IMAGE, FLAGD_TAG, &["start"]))
    }

    /// The Go in-process provider client of interop/go (scripts/install-compat.sh builds it),
    /// published as `REGISTRY/interop-go:test`; `None` (or a panic under `CI`) when missing.
    pub fn interop_go_image(&self) -> Option<String> {
        let client = required_file(
            &bin_dir().join("interop-go/flagd-proxy-interop-go"),
            "scripts/install-compat.sh builds it",
        )?;
        Some(self.binary_image(&client, "interop-go", "test", &[]))
    }

    /// An image of one binary (scripts/image-rootfs.sh + scripts/oci-archive.sh, user 65532),
    /// published as `REGISTRY/<name>:<tag>`.
    fn binary_image(&self, binary: &Path, name: &str, tag: &str, cmd: &[&str]) -> String {
        let archive = crate::target_tmpdir()
            .join("cluster-images")
            .join(format!("{name}.tar"));
        let built = format!("built:{name}");
        let mut images = self.images.lock().unwrap_or_else(|e| e.into_inner());
        if !images.contains(&built) {
            let dir = tempfile::tempdir().expect("tempdir");
            let rootfs = dir.path().join("rootfs");
            let file_name = binary
                .file_name()
                .and_then(|n| n.to_str())
                .expect("binary name");
            run_script(
                "scripts/image-rootfs.sh",
                &[
                    binary.to_str().expect("utf-8 path"),
                    rootfs.to_str().expect("utf-8 path"),
                ],
            );
            run_script(
                "scripts/oci-archive.sh",
                &[
                    rootfs.to_str().expect("utf-8 path"),
                    archive.to_str().expect("utf-8 path"),
                    &format!("localhost/{name}:{tag}"),
                    &serde_json::json!([format!("/{file_name}")]).to_string(),
                    &serde_json::json!(cmd).to_string(),
                    "65532:65532",
                ],
            );
            images.insert(built);
        }
        drop(images);
        self.publish_image(&archive, name, tag);
        format!("{REGISTRY}/{name}:{tag}")
    }
}

/// The `flagd-proxy-cluster` binary beside the running test binary, built (or found up to date)
/// by cargo first: the cluster tests' own build does not build this package's binaries.
fn cluster_binary() -> Result<PathBuf, String> {
    let profile_dir = crate::profile_dir();
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo
        .current_dir(repo_root())
        .args(["build", "--locked", "--quiet", "-p", "flagd-proxy-testkit"])
        .args(["--bin", "flagd-proxy-cluster"]);
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cargo.arg("--release");
        }
        Some(profile) => {
            cargo.args(["--profile", profile]);
        }
    }
    let output = cargo.output().map_err(|e| format!("run {cargo:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{cargo:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(profile_dir.join("flagd-proxy-cluster"))
}

fn run_script(script: &str, args: &[&str]) {
    run_ok(
        Command::new(repo_root().join(script)).args(args),
        &format!("{script} {args:?}"),
    );
}

/// Runs `command` (`what` names it in panics) and asserts that it succeeded; its output.
fn run_ok(command: &mut Command, what: &str) -> std::process::Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Whether kubectl's `error` says the API server could not be reached (as opposed to an answer).
fn api_server_unreachable(error: &str) -> bool {
    [
        "connect: connection refused",
        "connection reset by peer",
        "Unable to connect to the server",
        "http2: client connection lost",
        "TLS handshake timeout",
        "i/o timeout",
        "the server is currently unable to handle the request",
        "etcdserver: request timed out",
        "etcdserver: leader changed",
    ]
    .iter()
    .any(|sign| error.contains(sign))
}

/// Calls `check` every half second until it succeeds; the last error after `timeout`.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    let mut last_logged = Instant::now();
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(error) if Instant::now() < deadline => {
                if last_logged.elapsed() > Duration::from_secs(15) {
                    eprintln!("waiting for {what}: {error}");
                    last_logged = Instant::now();
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(error) => return Err(format!("{what}: gave up after {timeout:?}: {error}")),
        }
    }
}
