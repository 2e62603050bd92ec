//! A real Kubernetes control plane for integration tests: one etcd and one kube-apiserver,
//! both listening on 127.0.0.1 only, with the FeatureFlag and FeatureFlagSource CRDs installed.
//!
//! The binaries are built by `scripts/build-control-plane.sh` into
//! `${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}/bin` (or the directory named by
//! `FLAGD_PROXY_KUBE_BIN_DIR`); the CRDs come from the operator module that
//! `scripts/fetch-test-data.sh` downloads ([`test_data`]). When either is absent,
//! [`ControlPlane::start`] returns [`ControlPlaneError::BinariesMissing`] or
//! [`ControlPlaneError::TestDataMissing`]; [`start_or_skip`] turns that into a skip notice outside
//! CI and a failure inside it.
//!
//! Two identities authenticate with bearer tokens (`--token-auth-file`):
//! - an administrator in `system:masters` ([`ControlPlane::admin_client`]);
//! - `system:serviceaccount:flagd:proxy`, which RBAC allows nothing until a test grants it the
//!   `get`/`list`/`watch` ClusterRole on `featureflags` and `featureflagsources`, cluster-wide or
//!   per namespace, as the OpenFeature Operator does for the real proxy.
//!
//! There is no controller manager: namespaces can be created but never finish deleting, and no
//! service-account tokens are minted.
//!
//! Both server processes run under a small `sh` wrapper that holds a pipe from the test process and
//! kills the server when that pipe closes, so nothing outlives a test binary that is interrupted.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
};
use serde_json::json;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod binaries;
pub(crate) mod credentials;
pub(crate) mod processes;
mod rbac;

pub use self::binaries::{
    Binaries, TestDataMissing, bin_dir, cache_dir, find_binaries, java_class_path, test_data,
    test_data_or_skip,
};
use self::credentials::{client_from_kubeconfig, write_credentials};
pub use self::processes::free_port;
use self::processes::{Supervised, log_mentions_port_clash, tail, wait_for_etcd};
use crate::scrape::sum_samples;
pub use crate::scrape::{RequestCounts, connections_to, sum_long_running_watches};

/// API group of the OpenFeature custom resources.
pub const GROUP: &str = "core.openfeature.dev";
/// Served (and stored) version of both custom resources.
pub const VERSION: &str = "v1beta1";
/// User name of the restricted identity, as Kubernetes names the `proxy` service account of the
/// `flagd` namespace.
pub const PROXY_USER: &str = "system:serviceaccount:flagd:proxy";
/// Groups of the restricted identity.
pub const PROXY_GROUPS: [&str; 3] = [
    "system:serviceaccounts",
    "system:serviceaccounts:flagd",
    "system:authenticated",
];
/// The ClusterRole with `get`, `list` and `watch` on the OpenFeature resources.
pub const PROXY_CLUSTER_ROLE: &str = "flagd-proxy";
/// Name of the (Cluster)RoleBindings that the grant methods create.
pub const PROXY_BINDING: &str = "flagd-proxy";

/// The operator's CRDs, under [`test_data`].
pub const OPERATOR_CRDS: &str = "open-feature-operator/config/crd/bases";
const CRD_FILES: [&str; 2] = [
    "core.openfeature.dev_featureflags.yaml",
    "core.openfeature.dev_featureflagsources.yaml",
];
const CRD_NAMES: [&str; 2] = [
    "featureflags.core.openfeature.dev",
    "featureflagsources.core.openfeature.dev",
];

/// How long to wait for etcd, the apiserver or an RBAC change before giving up. Generous: the test
/// machines are small and shared.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a single probe request may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Start attempts when a freshly picked port turns out to be taken.
const START_ATTEMPTS: u32 = 3;

/// A FeatureFlag object for the API (see [`crate::feature_flag`]).
pub fn feature_flag_object(namespace: &str, name: &str, flags: serde_json::Value) -> DynamicObject {
    serde_json::from_value(crate::feature_flag(namespace, name, flags))
        .expect("a FeatureFlag object")
}

/// The FeatureFlag resource (`core.openfeature.dev/v1beta1`, plural `featureflags`).
pub fn feature_flag_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "FeatureFlag"),
        "featureflags",
    )
}

/// The FeatureFlagSource resource (`core.openfeature.dev/v1beta1`, plural `featureflagsources`).
pub fn feature_flag_source_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "FeatureFlagSource"),
        "featureflagsources",
    )
}

/// Why a control plane could not be started.
#[derive(Debug)]
pub enum ControlPlaneError {
    /// `kube-apiserver` and/or `etcd` are not in the binaries' directory.
    BinariesMissing {
        bin_dir: PathBuf,
        missing: Vec<PathBuf>,
    },
    /// Downloaded test data (the CRDs) is not in the cache; see [`test_data`].
    TestDataMissing(TestDataMissing),
    /// Everything else: a process that exited or never became ready, a bad CRD file, ...
    Startup(anyhow::Error),
}

impl ControlPlaneError {
    /// True when something the tests install is missing (binaries or test data), as opposed to
    /// a failure of what is installed.
    pub fn is_missing_dependency(&self) -> bool {
        matches!(
            self,
            ControlPlaneError::BinariesMissing { .. } | ControlPlaneError::TestDataMissing(_)
        )
    }
}

impl fmt::Display for ControlPlaneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlPlaneError::BinariesMissing { bin_dir, missing } => {
                let missing: Vec<String> =
                    missing.iter().map(|p| p.display().to_string()).collect();
                write!(
                    f,
                    "the Kubernetes control plane binaries are missing ({}); run \
                     scripts/build-control-plane.sh to build them into {} (the directory is \
                     ${{FLAGD_PROXY_KUBE_BIN_DIR}}, else ${{FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}}/bin)",
                    missing.join(", "),
                    bin_dir.display()
                )
            }
            ControlPlaneError::TestDataMissing(missing) => missing.fmt(f),
            ControlPlaneError::Startup(err) => write!(f, "control plane failed to start: {err:#}"),
        }
    }
}

impl std::error::Error for ControlPlaneError {}

impl From<anyhow::Error> for ControlPlaneError {
    fn from(err: anyhow::Error) -> Self {
        ControlPlaneError::Startup(err)
    }
}

/// Starts a control plane, or decides that the calling test is skipped: when the binaries are
/// missing this panics if `CI` is set and otherwise prints a notice and returns `None`. Any other
/// start failure panics.
pub async fn start_or_skip() -> Option<ControlPlane> {
    match ControlPlane::start().await {
        Ok(cp) => Some(cp),
        Err(err) if err.is_missing_dependency() => {
            crate::skip::skip(format_args!("no control plane: {err}"));
            None
        }
        Err(err) => panic!("{err}"),
    }
}

/// A running etcd + kube-apiserver pair. Dropping it stops both and deletes their data.
pub struct ControlPlane {
    apiserver: Option<Supervised>,
    etcd: Option<Supervised>,
    binaries: Binaries,
    apiserver_port: u16,
    etcd_client_port: u16,
    apiserver_args: Vec<String>,
    apiserver_log: PathBuf,
    admin_client: Client,
    admin_kubeconfig: PathBuf,
    proxy_kubeconfig: PathBuf,
    ca_path: PathBuf,
    proxy_token_path: PathBuf,
    // Last: removed only after the processes are gone.
    dir: TempDir,
}

/// A failed start attempt, and whether picking other ports may help.
struct AttemptError {
    error: anyhow::Error,
    port_clash: bool,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver on free loopback ports, waits until the apiserver is ready,
    /// installs both CRDs and waits until they are Established and served, and creates the
    /// restricted identity's ClusterRole without binding it.
    pub async fn start() -> Result<ControlPlane, ControlPlaneError> {
        let binaries = find_binaries(&bin_dir())?;
        let crds =
            load_crds(&test_data(OPERATOR_CRDS).map_err(ControlPlaneError::TestDataMissing)?)?;
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            match Self::start_once(&binaries).await {
                Ok(cp) => {
                    cp.install(&crds).await?;
                    return Ok(cp);
                }
                Err(AttemptError {
                    error,
                    port_clash: true,
                }) => failures.push(format!("{error:#}")),
                Err(AttemptError { error, .. }) => return Err(error.into()),
            }
        }
        Err(ControlPlaneError::Startup(anyhow!(
            "every attempt hit a port already in use:\n{}",
            failures.join("\n---\n")
        )))
    }

    async fn start_once(binaries: &Binaries) -> Result<ControlPlane, AttemptError> {
        let fatal = |error: anyhow::Error| AttemptError {
            error,
            port_clash: false,
        };
        let dir = tempfile::Builder::new()
            .prefix("flagd-proxy-control-plane-")
            .tempdir()
            .context("creating the control plane's temporary directory")
            .map_err(fatal)?;
        let root = dir.path().to_path_buf();

        let etcd_client_port = free_port().map_err(fatal)?;
        let etcd_peer_port = free_port().map_err(fatal)?;
        let apiserver_port = free_port().map_err(fatal)?;

        let files = write_credentials(&root, apiserver_port).map_err(fatal)?;

        // etcd
        let etcd_client_url = format!("http://127.0.0.1:{etcd_client_port}");
        let etcd_peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        let etcd_args = vec![
            "--name=flagd-proxy-test".to_owned(),
            format!("--data-dir={}", root.join("etcd-data").display()),
            format!("--listen-client-urls={etcd_client_url}"),
            format!("--advertise-client-urls={etcd_client_url}"),
            format!("--listen-peer-urls={etcd_peer_url}"),
            format!("--initial-advertise-peer-urls={etcd_peer_url}"),
            format!("--initial-cluster=flagd-proxy-test={etcd_peer_url}"),
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let etcd_log = root.join("etcd.log");
        let mut etcd = Supervised::spawn("etcd", &binaries.etcd, &etcd_args, &etcd_log, &root)
            .map_err(fatal)?;
        if let Err(error) = wait_for_etcd(&mut etcd, etcd_client_port).await {
            let port_clash = log_mentions_port_clash(&etcd_log);
            return Err(AttemptError { error, port_clash });
        }

        // kube-apiserver
        let apiserver_args = vec![
            format!("--etcd-servers={etcd_client_url}"),
            format!("--cert-dir={}", root.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", files.serving_cert.display()),
            format!("--tls-private-key-file={}", files.serving_key.display()),
            format!("--secure-port={apiserver_port}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            "--endpoint-reconciler-type=none".to_owned(),
            "--authorization-mode=RBAC".to_owned(),
            "--disable-admission-plugins=ServiceAccount".to_owned(),
            "--allow-privileged=true".to_owned(),
            format!("--token-auth-file={}", files.token_csv.display()),
            format!("--service-account-issuer=https://127.0.0.1:{apiserver_port}"),
            format!(
                "--service-account-key-file={}",
                files.sa_public_key.display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                files.sa_private_key.display()
            ),
        ];
        let apiserver_log = root.join("kube-apiserver.log");
        let apiserver = Supervised::spawn(
            "kube-apiserver",
            &binaries.kube_apiserver,
            &apiserver_args,
            &apiserver_log,
            &root,
        )
        .map_err(fatal)?;

        let admin_client = client_from_kubeconfig(&files.admin_kubeconfig)
            .await
            .map_err(fatal)?;
        let mut cp = ControlPlane {
            apiserver: Some(apiserver),
            etcd: Some(etcd),
            binaries: binaries.clone(),
            apiserver_port,
            etcd_client_port,
            apiserver_args,
            apiserver_log: apiserver_log.clone(),
            admin_client,
            admin_kubeconfig: files.admin_kubeconfig,
            proxy_kubeconfig: files.proxy_kubeconfig,
            ca_path: files.ca_cert,
            proxy_token_path: files.proxy_token,
            dir,
        };
        if let Err(error) = cp.wait_for_apiserver().await {
            let port_clash = log_mentions_port_clash(&apiserver_log);
            return Err(AttemptError { error, port_clash });
        }
        Ok(cp)
    }

    /// Installs the CRDs and the ClusterRole.
    async fn install(&self, crds: &[CustomResourceDefinition]) -> anyhow::Result<()> {
        self.install_crds(crds).await?;

        let role: ClusterRole = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": { "name": PROXY_CLUSTER_ROLE },
            "rules": [{
                "apiGroups": [GROUP],
                "resources": ["featureflags", "featureflagsources"],
                "verbs": ["get", "list", "watch"],
            }],
        }))
        .context("building the ClusterRole")?;
        Api::<ClusterRole>::all(self.admin_client.clone())
            .create(&PostParams::default(), &role)
            .await
            .context("creating the proxy's ClusterRole")?;
        Ok(())
    }

    /// Creates `crds` and waits until they are Established and their resources served.
    async fn install_crds(&self, crds: &[CustomResourceDefinition]) -> anyhow::Result<()> {
        let crd_api: Api<CustomResourceDefinition> = Api::all(self.admin_client.clone());
        for crd in crds {
            crd_api
                .create(&PostParams::default(), crd)
                .await
                .with_context(|| {
                    format!(
                        "creating CRD {}",
                        crd.metadata.name.as_deref().unwrap_or("?")
                    )
                })?;
        }
        for name in CRD_NAMES {
            self.wait_until(&format!("CRD {name} to be Established"), || async {
                let crd = crd_api.get(name).await?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                anyhow::Ok(
                    established
                        .then_some(())
                        .ok_or_else(|| "not Established yet".to_owned()),
                )
            })
            .await
            .with_context(|| format!("waiting for CRD {name}"))?;
        }
        self.wait_for_custom_resources().await?;
        Ok(())
    }

    /// Deletes the FeatureFlag CRD, and with it every FeatureFlag, and waits until it is gone.
    pub async fn delete_feature_flag_crd(&self) {
        let crd_api: Api<CustomResourceDefinition> = Api::all(self.admin_client.clone());
        let name = CRD_NAMES[0];
        crd_api
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting CRD {name}: {e}"));
        self.wait_until(&format!("CRD {name} to be gone"), || async {
            let crd = crd_api.get_opt(name).await?;
            anyhow::Ok(match crd {
                None => Ok(()),
                Some(_) => Err("still there".to_owned()),
            })
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// Creates the FeatureFlag CRD again (after [`Self::delete_feature_flag_crd`]) and waits
    /// until FeatureFlags are served.
    pub async fn create_feature_flag_crd(&self) {
        let crds = load_crds(&test_data(OPERATOR_CRDS).unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e:#}"));
        let crd: Vec<CustomResourceDefinition> = crds
            .into_iter()
            .filter(|crd| crd.metadata.name.as_deref() == Some(CRD_NAMES[0]))
            .collect();
        self.install_crds(&crd)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// A client authenticated as the administrator (group `system:masters`).
    pub fn admin_client(&self) -> Client {
        self.admin_client.clone()
    }

    /// A new client authenticated as the restricted proxy identity.
    pub async fn proxy_client(&self) -> Client {
        client_from_kubeconfig(&self.proxy_kubeconfig)
            .await
            .expect("building a client from the proxy kubeconfig")
    }

    /// A kubeconfig file for the administrator, usable through `KUBECONFIG` by a child process.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A kubeconfig file for `system:serviceaccount:flagd:proxy`.
    pub fn proxy_kubeconfig(&self) -> &Path {
        &self.proxy_kubeconfig
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.apiserver_port)
    }

    /// PEM file of the CA that signed the apiserver's serving certificate.
    pub fn ca_path(&self) -> &Path {
        &self.ca_path
    }

    /// File holding the proxy identity's bearer token (no trailing newline, like a mounted
    /// service-account token).
    pub fn proxy_token_path(&self) -> &Path {
        &self.proxy_token_path
    }

    /// The proxy's command-line flags for this API server as the restricted identity
    /// (`--kube-api-server`, `--kube-ca-path`, `--kube-token-path`), followed by `extra`.
    pub fn proxy_args(&self, extra: &[&str]) -> Vec<String> {
        let mut args = vec![
            "--kube-api-server".to_owned(),
            self.server_url(),
            "--kube-ca-path".to_owned(),
            self.ca_path().display().to_string(),
            "--kube-token-path".to_owned(),
            self.proxy_token_path().display().to_string(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    }

    /// The API server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.apiserver_port
    }

    /// The temporary directory holding the certificates, kubeconfigs, logs and etcd data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Creates namespace `ns` (an existing one is fine).
    pub async fn create_namespace(&self, ns: &str) {
        let namespace: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": { "name": ns },
        }))
        .expect("building the Namespace");
        match Api::<Namespace>::all(self.admin_client.clone())
            .create(&PostParams::default(), &namespace)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => panic!("creating namespace {ns}: {e}"),
        }
    }

    /// Sum of `apiserver_longrunning_requests{verb="WATCH",resource=<resource>}` over all other
    /// labels, read from the apiserver's `/metrics`: the number of watch requests on that
    /// resource that are open right now.
    pub async fn open_watches(&self, resource: &str) -> u64 {
        let text = self
            .admin_get("/metrics")
            .await
            .expect("reading the apiserver's /metrics");
        sum_long_running_watches(&text, resource)
    }

    /// Sum of `apiserver_request_total{verb=<verb>,resource=<resource>}`: the requests of that
    /// kind it answered since it started. `verb` is as the API server counts it: `LIST`, `WATCH`,
    /// `GET`, ...; it counts a list limited to one name (`fieldSelector=metadata.name=...`, what
    /// the proxy makes) as a `GET`.
    pub async fn requests(&self, verb: &str, resource: &str) -> u64 {
        let text = self
            .admin_get("/metrics")
            .await
            .expect("reading the apiserver's /metrics");
        sum_samples(&text, "apiserver_request_total", verb, resource)
    }

    /// Every request count the API server keeps and the watches open on it, by verb and
    /// resource: two readings tell what was asked in between ([`RequestCounts::since`]).
    pub async fn request_counts(&self) -> RequestCounts {
        let text = self
            .admin_get("/metrics")
            .await
            .expect("reading the apiserver's /metrics");
        RequestCounts::parse(&text)
    }

    /// Polls `open_watches(resource)` until it equals `want` (within a hang guard of a minute).
    pub async fn wait_for_open_watches(&self, resource: &str, want: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = self.open_watches(resource).await;
            if now == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "open {resource} watches stayed at {now}, want {want}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Compacts etcd's history up to its current revision, as kube-apiserver does every five
    /// minutes: a watch from any older resource version is then answered 410 Gone. Returns the
    /// revision.
    pub async fn compact_etcd(&self) -> u64 {
        // etcd's JSON gateway: a range request's header carries the current revision.
        let range = self
            .etcd_post("/v3/kv/range", &json!({"key": "AA=="}).to_string())
            .await;
        let revision: u64 = range["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("no revision in etcd's answer: {range}"));
        self.etcd_post(
            "/v3/kv/compaction",
            &json!({"revision": revision.to_string(), "physical": true}).to_string(),
        )
        .await;
        revision
    }

    /// POSTs `body` to etcd's JSON gateway; the answer. Panics on a failure.
    async fn etcd_post(&self, path: &str, body: &str) -> serde_json::Value {
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.etcd_client_port))
                .await
                .context("connect to etcd")?;
            let request = format!(
                "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(request.as_bytes()).await?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await?;
            anyhow::Ok(answer)
        };
        let answer = tokio::time::timeout(PROBE_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| panic!("etcd did not answer POST {path}"))
            .unwrap_or_else(|e| panic!("POST {path} to etcd: {e:#}"));
        let (head, json) = answer
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("etcd's answer to {path}: {answer}"));
        assert!(
            head.starts_with("HTTP/1.1 200"),
            "etcd's answer to {path}: {answer}"
        );
        serde_json::from_str(json.trim())
            .unwrap_or_else(|e| panic!("etcd's answer to {path} is not JSON ({e}): {json}"))
    }

    /// Kills the apiserver (SIGKILL, as a crash would) and waits for it to exit. etcd keeps
    /// running.
    pub async fn stop_apiserver(&mut self) {
        if let Some(mut apiserver) = self.apiserver.take() {
            apiserver.stop();
        }
    }

    /// Starts the apiserver again with the same port, etcd, certificates and tokens, and waits
    /// until it is ready and serves the custom resources.
    pub async fn start_apiserver(&mut self) {
        assert!(
            self.apiserver.is_none(),
            "start_apiserver called while the apiserver is running"
        );
        let apiserver = Supervised::spawn(
            "kube-apiserver",
            &self.binaries.kube_apiserver,
            &self.apiserver_args,
            &self.apiserver_log,
            self.dir.path(),
        )
        .expect("restarting kube-apiserver");
        self.apiserver = Some(apiserver);
        self.wait_for_apiserver()
            .await
            .unwrap_or_else(|e| panic!("kube-apiserver did not come back: {e:#}"));
        self.wait_for_custom_resources()
            .await
            .unwrap_or_else(|e| panic!("custom resources not served after restart: {e:#}"));
    }

    /// `GET path` as the administrator, returning the body.
    async fn admin_get(&self, path: &str) -> anyhow::Result<String> {
        let request = http::Request::get(path)
            .body(Vec::new())
            .context("building a request")?;
        let text = tokio::time::timeout(PROBE_TIMEOUT, self.admin_client.request_text(request))
            .await
            .with_context(|| format!("GET {path} timed out"))?
            .with_context(|| format!("GET {path}"))?;
        Ok(text)
    }

    /// Polls `/readyz` until it answers `ok`, failing early if the process exits.
    async fn wait_for_apiserver(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut pause = Duration::from_millis(100);
        loop {
            if let Some(apiserver) = self.apiserver.as_mut()
                && let Some(status) = apiserver.exited()
            {
                return Err(apiserver.failure(&format!("exited ({status}) before becoming ready")));
            }
            let last = match self.admin_get("/readyz").await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => body,
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                let apiserver = self.apiserver.as_ref().context("apiserver not running")?;
                return Err(apiserver.failure(&format!(
                    "not ready after {READY_TIMEOUT:?}; last /readyz answer: {last}"
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Waits until listing FeatureFlags and FeatureFlagSources as the administrator succeeds.
    async fn wait_for_custom_resources(&self) -> anyhow::Result<()> {
        for resource in [feature_flag_resource(), feature_flag_source_resource()] {
            let api: Api<DynamicObject> = Api::all_with(self.admin_client.clone(), &resource);
            self.wait_until(&format!("{} to be served", resource.plural), || async {
                match api.list(&ListParams::default().limit(1)).await {
                    Ok(_) => anyhow::Ok(Ok(())),
                    Err(e) => anyhow::Ok(Err(e.to_string())),
                }
            })
            .await?;
        }
        Ok(())
    }

    /// Polls `check` until it returns `Ok(Ok(_))`; `Ok(Err(why))` means "not yet", `Err` aborts.
    async fn wait_until<T, F, Fut>(&self, what: &str, mut check: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<Result<T, String>>>,
    {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut pause = Duration::from_millis(50);
        loop {
            let last = match tokio::time::timeout(PROBE_TIMEOUT, check()).await {
                Ok(Ok(Ok(value))) => return Ok(value),
                Ok(Ok(Err(why))) => why,
                Ok(Err(e)) => return Err(e.context(format!("while waiting for {what}"))),
                Err(_) => format!("probe timed out after {PROBE_TIMEOUT:?}"),
            };
            if Instant::now() >= deadline {
                bail!("gave up waiting for {what} after {READY_TIMEOUT:?}; last: {last}");
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    fn print_log_tails(&self) {
        for (name, log) in [
            ("kube-apiserver", self.apiserver_log.clone()),
            ("etcd", self.dir.path().join("etcd.log")),
        ] {
            eprintln!(
                "---- last lines of the {name} log ({}) ----\n{}",
                log.display(),
                tail(&log, 40)
            );
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_log_tails();
        }
        if let Some(mut apiserver) = self.apiserver.take() {
            apiserver.stop();
        }
        if let Some(mut etcd) = self.etcd.take() {
            etcd.stop();
        }
    }
}

/// Reads and parses the two CRD files.
fn load_crds(dir: &Path) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    CRD_FILES
        .iter()
        .map(|file| {
            let path = dir.join(file);
            let text =
                fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            serde_norway::from_str(&text).with_context(|| {
                format!("parsing {} as a CustomResourceDefinition", path.display())
            })
        })
        .collect()
}
