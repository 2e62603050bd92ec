//! The cluster's machine side: its daemons, started in order under the control plane's
//! supervisor ([`Supervised`]) inside the network namespace [`NETNS`], and stopped in reverse
//! order when the [`Node`] is dropped, which then removes everything the cluster made on this
//! machine ([`teardown::remove_all`]). [`Node::up`] first removes whatever an earlier run that
//! was killed left behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

use super::config;
use super::layout::{Layout, in_netns, log, output};
use super::names::{API_SERVICE_IP, NETNS, NODE, NODE_IP, REGISTRY, SVC_CIDR, netns_path};
use super::teardown::{self, make_cgroup_roots, remove_all, save_sysctls};
use crate::control_plane::credentials::{ClusterIdentity, write_cluster_pki};
use crate::control_plane::processes::Supervised;

/// How long the daemons get to stop after SIGTERM before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Bound for one step of the start (a daemon ready, the node Ready, CoreDNS rolled out).
const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// The running cluster's daemons. Dropping it stops them and removes all the cluster's state.
pub struct Node {
    layout: Layout,
    /// In the order they started.
    daemons: Vec<Supervised>,
}

impl Node {
    /// Removes what an earlier cluster left, then starts one and waits until its node is Ready
    /// and CoreDNS serves. On failure, what was started is torn down again.
    pub fn up(layout: Layout) -> anyhow::Result<Node> {
        let missing = super::missing_dependencies();
        if !missing.is_empty() {
            bail!("missing: {}", missing.join("; "));
        }
        remove_all(&layout);
        // From here on, dropping the node (a failure below) removes all of it again.
        let mut node = Node {
            layout,
            daemons: Vec::new(),
        };
        node.start()?;
        Ok(node)
    }

    fn start(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let state = self.layout.state.clone();
        for dir in [
            state.join("etc"),
            state.join("cni/net.d"),
            self.layout.logs(),
            self.layout.run.clone(),
        ] {
            fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        // kubelet changes these machine-wide; the teardown puts them back.
        save_sysctls(&self.layout.sysctls())
            .context("saving the kernel settings kubelet changes")?;
        write_cluster_pki(
            &state,
            &ClusterIdentity {
                node: NODE,
                node_ip: NODE_IP,
                service_ip: API_SERVICE_IP,
            },
        )?;
        network()?;
        let socket = self.layout.containerd_socket();
        for (file, contents) in [
            ("cni/net.d/10-bridge.conflist", config::cni(&state)),
            (
                "etc/containerd.toml",
                config::containerd(&state, &self.layout.run, &socket),
            ),
            ("etc/resolv.conf", config::resolv_conf()),
            ("etc/kubelet.yaml", config::kubelet(&state, &socket)),
            ("etc/kube-proxy.yaml", config::kube_proxy(&state)),
        ] {
            let path = state.join(file);
            fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
        }
        log(format_args!("network namespace {NETNS}, node {NODE_IP}"));

        let config = |file: &str| state.join(file).display().to_string();
        self.spawn(
            "containerd",
            Path::new("containerd"),
            vec!["--config".into(), config("etc/containerd.toml")],
        )?;
        self.wait_for("containerd", &["containerd"], |l| l.ctr(&["version"]))?;
        self.import_system_images()?;

        let bins = self.layout.bins.clone();
        self.spawn(
            "etcd",
            &bins.join("etcd"),
            [
                "--name=node",
                &format!("--data-dir={}", config("etcd")),
                "--listen-client-urls=http://127.0.0.1:2379",
                "--advertise-client-urls=http://127.0.0.1:2379",
                "--listen-peer-urls=http://127.0.0.1:2380",
                "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                "--initial-cluster=node=http://127.0.0.1:2380",
                "--listen-metrics-urls=http://127.0.0.1:2381",
                "--unsafe-no-fsync",
            ]
            .map(String::from)
            .to_vec(),
        )?;
        self.spawn_apiserver()?;
        self.wait_for("the API server", &["etcd", "kube-apiserver"], |l| {
            l.kubectl(&["get", "--raw", "/readyz"], None)
        })?;
        log(format_args!(
            "API server ready (+{:.1?})",
            started.elapsed()
        ));

        let pki = |file: &str| config(&format!("pki/{file}"));
        // Both controllers: their kubeconfig for every API call, listening on loopback only.
        let controller = |kubeconfig: &str, rest: &[String]| {
            let kubeconfig = config(kubeconfig);
            let mut args: Vec<String> = ["", "authentication-", "authorization-"]
                .iter()
                .map(|kind| format!("--{kind}kubeconfig={kubeconfig}"))
                .collect();
            args.extend(["--bind-address=127.0.0.1", "--leader-elect=false"].map(String::from));
            args.extend_from_slice(rest);
            args
        };
        let args = controller(
            "controller-manager.kubeconfig",
            &[
                format!("--service-account-private-key-file={}", pki("sa.key")),
                format!("--root-ca-file={}", pki("ca.crt")),
                "--use-service-account-credentials=true".into(),
                format!("--cluster-signing-cert-file={}", pki("ca.crt")),
                format!("--cluster-signing-key-file={}", pki("ca.key")),
                format!("--service-cluster-ip-range={SVC_CIDR}"),
                "--allocate-node-cidrs=false".into(),
                "--controllers=*,-nodeipam".into(),
            ],
        );
        self.spawn(
            "kube-controller-manager",
            &bins.join("kube-controller-manager"),
            args,
        )?;
        let args = controller("scheduler.kubeconfig", &[]);
        self.spawn("kube-scheduler", &bins.join("kube-scheduler"), args)?;
        make_cgroup_roots().context("creating the cluster's cgroup root")?;
        self.spawn(
            "kubelet",
            &bins.join("kubelet"),
            vec![
                format!("--config={}", config("etc/kubelet.yaml")),
                format!("--kubeconfig={}", config("kubelet.kubeconfig")),
                format!("--root-dir={}", config("kubelet")),
                format!("--hostname-override={NODE}"),
                format!("--node-ip={NODE_IP}"),
            ],
        )?;
        self.spawn(
            "kube-proxy",
            &bins.join("kube-proxy"),
            vec![format!("--config={}", config("etc/kube-proxy.yaml"))],
        )?;
        self.spawn(
            "registry",
            &bins.join("crane"),
            vec![
                "registry".into(),
                "serve".into(),
                "--address".into(),
                REGISTRY.into(),
            ],
        )?;

        let node = format!("node/{NODE}");
        self.wait_for(&format!("node {NODE} Ready"), &["kubelet"], |l| {
            l.kubectl(
                &["wait", "--for=condition=Ready", &node, "--timeout=2s"],
                None,
            )
        })?;
        log(format_args!("node Ready (+{:.1?})", started.elapsed()));
        self.wait_for("the default service account", &[], |l| {
            l.kubectl(&["get", "serviceaccount", "default"], None)
        })?;
        self.layout
            .kubectl(&["apply", "-f", "-"], Some(&config::coredns()))?;
        let rollout = self.wait_for("CoreDNS", &["kubelet"], |l| {
            l.kubectl(
                &[
                    "-n",
                    "kube-system",
                    "rollout",
                    "status",
                    "deploy/coredns",
                    "--timeout=2s",
                ],
                None,
            )
        });
        if let Err(error) = rollout {
            let pods = self
                .layout
                .kubectl(&["-n", "kube-system", "get", "pods", "-o", "wide"], None)
                .unwrap_or_else(|e| e.to_string());
            return Err(error.context(pods));
        }
        log(format_args!(
            "cluster up in {:.1?}; KUBECONFIG={} inside netns {NETNS}",
            started.elapsed(),
            self.layout.admin_kubeconfig().display()
        ));
        Ok(())
    }

    /// The pause image (busybox) and CoreDNS's, imported into containerd.
    fn import_system_images(&self) -> anyhow::Result<()> {
        let dir = self.layout.state.join("images");
        let pause_rootfs = dir.join("pause-rootfs");
        fs::create_dir_all(&pause_rootfs).context("creating the pause image's folder")?;
        fs::copy("/bin/busybox", pause_rootfs.join("busybox")).context("copying busybox")?;
        let coredns = fs::canonicalize(self.layout.bins.join("coredns"))
            .context("locating the coredns binary")?;
        let script = |name: &str| crate::repo_root().join("scripts").join(name);
        let path = |p: PathBuf| p.into_os_string();
        let steps: [(&str, Vec<std::ffi::OsString>); 3] = [
            (
                "oci-archive.sh",
                vec![
                    path(pause_rootfs),
                    path(dir.join("pause.tar")),
                    "localhost/pause:1".into(),
                    r#"["/busybox","sleep","2147483647"]"#.into(),
                ],
            ),
            (
                "image-rootfs.sh",
                vec![path(coredns), path(dir.join("coredns-rootfs"))],
            ),
            (
                "oci-archive.sh",
                vec![
                    path(dir.join("coredns-rootfs")),
                    path(dir.join("coredns.tar")),
                    "localhost/coredns:1".into(),
                    r#"["/coredns"]"#.into(),
                ],
            ),
        ];
        for (name, args) in steps {
            output(Command::new(script(name)).args(args), None)?;
        }
        self.layout.load(&dir.join("pause.tar"))?;
        self.layout.load(&dir.join("coredns.tar"))?;
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))
    }

    /// Starts `program args` inside the namespace under the supervisor, logging to
    /// `logs/<name>.log`.
    fn spawn(
        &mut self,
        name: &'static str,
        program: &Path,
        args: Vec<String>,
    ) -> anyhow::Result<()> {
        let mut all = vec![
            format!("--net={}", netns_path().display()),
            program.display().to_string(),
        ];
        all.extend(args);
        let log = self.layout.logs().join(format!("{name}.log"));
        let daemon = Supervised::spawn(name, Path::new("nsenter"), &all, &log, &self.layout.state)?;
        self.daemons.push(daemon);
        Ok(())
    }

    fn spawn_apiserver(&mut self) -> anyhow::Result<()> {
        let pki = |file: &str| {
            self.layout
                .state
                .join("pki")
                .join(file)
                .display()
                .to_string()
        };
        let args = vec![
            "--etcd-servers=http://127.0.0.1:2379".to_owned(),
            "--bind-address=0.0.0.0".to_owned(),
            format!("--advertise-address={NODE_IP}"),
            "--secure-port=6443".to_owned(),
            format!("--tls-cert-file={}", pki("apiserver.crt")),
            format!("--tls-private-key-file={}", pki("apiserver.key")),
            format!("--client-ca-file={}", pki("ca.crt")),
            format!("--service-account-key-file={}", pki("sa.pub")),
            format!("--service-account-signing-key-file={}", pki("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            "--authorization-mode=Node,RBAC".to_owned(),
            "--allow-privileged=true".to_owned(),
            format!("--service-cluster-ip-range={SVC_CIDR}"),
            format!(
                "--kubelet-client-certificate={}",
                pki("apiserver-kubelet-client.crt")
            ),
            format!(
                "--kubelet-client-key={}",
                pki("apiserver-kubelet-client.key")
            ),
            format!("--kubelet-certificate-authority={}", pki("ca.crt")),
            "--kubelet-preferred-address-types=InternalIP".to_owned(),
            "--enable-admission-plugins=NodeRestriction".to_owned(),
            "--profiling=false".to_owned(),
        ];
        let program = self.layout.bins.join("kube-apiserver");
        self.spawn("kube-apiserver", &program, args)
    }

    /// Stops the API server (SIGTERM; killed after [`STOP_GRACE`]) and starts it again; returns
    /// once it is ready.
    pub fn restart_apiserver(&mut self) -> anyhow::Result<()> {
        let index = self
            .daemons
            .iter()
            .position(|d| d.name() == "kube-apiserver")
            .ok_or_else(|| anyhow!("the API server is not running"))?;
        let mut apiserver = self.daemons.remove(index);
        apiserver.terminate();
        let deadline = Instant::now() + STOP_GRACE;
        while apiserver.exited().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        apiserver.stop();
        self.spawn_apiserver()?;
        // Back in its place in the start order (the teardown stops daemons in reverse).
        if let Some(restarted) = self.daemons.pop() {
            self.daemons.insert(index, restarted);
        }
        self.wait_for("the API server", &["kube-apiserver"], |l| {
            l.kubectl(&["get", "--raw", "/readyz"], None)
        })?;
        log(format_args!("API server restarted"));
        Ok(())
    }

    /// Calls `check` every half second until it succeeds, for up to [`STEP_TIMEOUT`]; fails at
    /// once, with the end of its log, when one of the daemons `watched` exits meanwhile.
    fn wait_for<T>(
        &mut self,
        what: &str,
        watched: &[&str],
        check: impl Fn(&Layout) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            for daemon in &mut self.daemons {
                if watched.contains(&daemon.name())
                    && let Some(status) = daemon.exited()
                {
                    return Err(
                        daemon.failure(&format!("exited ({status}) while waiting for {what}"))
                    );
                }
            }
            match check(&self.layout) {
                Ok(value) => return Ok(value),
                Err(error) if Instant::now() >= deadline => {
                    return Err(error.context(format!(
                        "timed out after {STEP_TIMEOUT:?} waiting for {what}"
                    )));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        log(format_args!("tearing down"));
        for daemon in self.daemons.iter_mut().rev() {
            daemon.terminate();
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline && self.daemons.iter_mut().any(|d| d.exited().is_none()) {
            std::thread::sleep(Duration::from_millis(100));
        }
        while let Some(mut daemon) = self.daemons.pop() {
            daemon.stop();
        }
        teardown::remove_all(&self.layout);
        log(format_args!("down"));
    }
}

/// The namespace with loopback up and the node address on a veth inside it, the Service range
/// routed to it (traffic to a Service address from the node itself needs a route before
/// kube-proxy's DNAT), and forwarding on, in the namespace only.
fn network() -> anyhow::Result<()> {
    let node_address = format!("{NODE_IP}/24");
    let steps: [&[&str]; 7] = [
        &["netns", "add", NETNS],
        &["-n", NETNS, "link", "set", "lo", "up"],
        &[
            "-n", NETNS, "link", "add", "kn0", "type", "veth", "peer", "name", "kn1",
        ],
        &["-n", NETNS, "link", "set", "kn0", "up"],
        &["-n", NETNS, "link", "set", "kn1", "up"],
        &["-n", NETNS, "addr", "add", &node_address, "dev", "kn0"],
        &["-n", NETNS, "route", "add", SVC_CIDR, "dev", "kn0"],
    ];
    for args in steps {
        output(Command::new("ip").args(args), None)?;
    }
    let mut sysctl = in_netns("sysctl");
    sysctl.args([
        "-qw",
        "net.ipv4.ip_forward=1",
        "net.bridge.bridge-nf-call-iptables=1",
    ]);
    output(&mut sysctl, None).map(drop)
}
