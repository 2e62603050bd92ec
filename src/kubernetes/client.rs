//! The Kubernetes client: where its configuration comes from, and the bearer token file.
//!
//! The configuration is `--kube-api-server` (with its CA and token files), else the files named
//! by `KUBECONFIG`, else the pod's service account; nothing else (not `~/.kube/config`). A
//! token kept in a file is re-read every few seconds, so a rotated token is picked up. The one
//! [`Client`] built here is shared by every watch (and the authorization reviews).
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderValue;
use kube::config::{InClusterError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// How long a bearer token read from a file is used before the file is read again.
const TOKEN_REREAD: Duration = Duration::from_secs(5);

/// How to reach the API server.
#[derive(Clone, Debug, Default)]
pub struct KubeSettings {
    pub api_server: Option<String>,
    pub ca_path: Option<PathBuf>,
    pub token_path: Option<PathBuf>,
}

/// A Kubernetes configuration that cannot work; reported before the proxy listens.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error(
        "no Kubernetes API configuration found: set KUBECONFIG, run inside a cluster (with a \
         service account token mounted), pass --kube-api-server URL (with --kube-ca-path and \
         --kube-token-path), or serve manifest files with --manifests DIR"
    )]
    NoConfiguration,
    #[error("--kube-api-server {url:?} is not a usable URL: {reason}")]
    ApiServerUrl { url: String, reason: String },
    #[error("--kube-ca-path {path}: {reason}")]
    CaFile { path: PathBuf, reason: String },
    #[error("{what} {path}: {reason}")]
    TokenFile {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("KUBECONFIG={value}: {source}")]
    Kubeconfig {
        value: String,
        #[source]
        source: KubeconfigError,
    },
    #[error("in-cluster Kubernetes configuration (KUBERNETES_SERVICE_HOST is set): {0}")]
    InCluster(#[source] InClusterError),
    #[error(
        "the Kubernetes configuration for {server} names the proxy {proxy} (kubeconfig \
         proxy-url): flagd-proxy connects to the API server directly and does not go through a \
         proxy; remove proxy-url, or point the configuration at an address of the API server \
         that needs none"
    )]
    ProxyUrl { server: String, proxy: String },
    #[error("cannot build the Kubernetes client for {server}: {source}")]
    Client {
        server: String,
        #[source]
        source: kube::Error,
    },
}

/// Where the configuration comes from, in order of precedence.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ConfigChoice {
    /// `--kube-api-server` (with its CA and token files).
    ApiServer(String),
    /// The files named by `KUBECONFIG`.
    Kubeconfig(OsString),
    /// The pod's service account (`KUBERNETES_SERVICE_HOST` is set).
    InCluster,
    /// Nothing applies.
    None,
}

impl ConfigChoice {
    fn label(&self) -> &'static str {
        match self {
            ConfigChoice::ApiServer(_) => "--kube-api-server",
            ConfigChoice::Kubeconfig(_) => "KUBECONFIG",
            ConfigChoice::InCluster => "in-cluster",
            ConfigChoice::None => "none",
        }
    }
}

/// Picks the configuration: `--kube-api-server`, else `KUBECONFIG` if set, else in-cluster if
/// `KUBERNETES_SERVICE_HOST` is set. `~/.kube/config` is deliberately not read (as the Go
/// flagd-proxy), so a proxy never silently uses a developer's credentials.
fn choose(
    settings: &KubeSettings,
    kubeconfig: Option<OsString>,
    service_host: Option<OsString>,
) -> ConfigChoice {
    if let Some(url) = settings.api_server.as_deref().map(str::trim)
        && !url.is_empty()
    {
        return ConfigChoice::ApiServer(url.to_owned());
    }
    if let Some(value) =
        kubeconfig.filter(|v| std::env::split_paths(v).any(|p| !p.as_os_str().is_empty()))
    {
        return ConfigChoice::Kubeconfig(value);
    }
    if service_host.is_some_and(|h| !h.is_empty()) {
        return ConfigChoice::InCluster;
    }
    ConfigChoice::None
}

/// A client ready for use, and how it was configured.
pub(crate) struct Configured {
    pub client: Client,
    /// The API server's URL.
    pub server: String,
    /// Where the configuration came from (`--kube-api-server`, `KUBECONFIG`, `in-cluster`).
    pub configured_by: &'static str,
}

/// Builds the client from the settings or the environment. Does not contact the API server.
pub(crate) async fn configure(settings: &KubeSettings) -> Result<Configured, KubeError> {
    // kube's TLS and the sync port use the same provider; installing it twice is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let choice = choose(
        settings,
        std::env::var_os("KUBECONFIG"),
        std::env::var_os("KUBERNETES_SERVICE_HOST"),
    );
    let (config, token) = match &choice {
        ConfigChoice::ApiServer(url) => api_server_config(url, settings)?,
        ConfigChoice::Kubeconfig(value) => {
            let shown = value.to_string_lossy().into_owned();
            let wrap = |source| KubeError::Kubeconfig {
                value: shown.clone(),
                source,
            };
            let kubeconfig = Kubeconfig::from_env()
                .map_err(wrap)?
                .ok_or(KubeError::NoConfiguration)?;
            let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(wrap)?;
            take_over_token_file(config, "the kubeconfig's tokenFile")?
        }
        ConfigChoice::InCluster => {
            let config = Config::incluster().map_err(KubeError::InCluster)?;
            take_over_token_file(config, "the service account token")?
        }
        ConfigChoice::None => return Err(KubeError::NoConfiguration),
    };
    let server = config.cluster_url.to_string();
    if let Some(proxy) = &config.proxy_url {
        return Err(KubeError::ProxyUrl {
            server,
            proxy: proxy.to_string(),
        });
    }
    let client = build_client(config, token).map_err(|source| KubeError::Client {
        server: server.clone(),
        source,
    })?;
    Ok(Configured {
        client,
        server,
        configured_by: choice.label(),
    })
}

/// The configuration for `--kube-api-server`, its CA file and its token file.
fn api_server_config(
    url: &str,
    settings: &KubeSettings,
) -> Result<(Config, Option<Arc<TokenFile>>), KubeError> {
    let bad_url = |reason: &str| KubeError::ApiServerUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad_url(&e.to_string()))?;
    match uri.scheme_str() {
        Some("https" | "http") => {}
        _ => return Err(bad_url("it must start with https:// (or http://)")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad_url("it has no host"));
    }
    let mut config = Config::new(uri);
    if let Some(path) = &settings.ca_path {
        config.root_cert = Some(read_ca(path).map_err(|reason| KubeError::CaFile {
            path: path.clone(),
            reason,
        })?);
        // kube re-reads this file about once a minute, so a rotated CA is picked up.
        config.root_cert_file = Some(path.clone());
    }
    let token = match &settings.token_path {
        Some(path) => Some(Arc::new(TokenFile::open(path, "--kube-token-path")?)),
        None => None,
    };
    Ok((config, token))
}

/// The DER certificates in a PEM file; an error if there are none.
fn read_ca(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate bundle: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate".to_owned());
    }
    Ok(certs)
}

/// Moves a token file out of kube's hands into a [`TokenFile`] (trimmed, re-read every few
/// seconds), when it is the credential kube would use.
fn take_over_token_file(
    mut config: Config,
    what: &'static str,
) -> Result<(Config, Option<Arc<TokenFile>>), KubeError> {
    let auth = &config.auth_info;
    let file_is_used = auth.auth_provider.is_none()
        && !(auth.username.is_some() && auth.password.is_some())
        && auth.token.is_none();
    match config.auth_info.token_file.take() {
        Some(path) if file_is_used => {
            let token = TokenFile::open(Path::new(&path), what)?;
            Ok((config, Some(Arc::new(token))))
        }
        other => {
            config.auth_info.token_file = other;
            Ok((config, None))
        }
    }
}

/// One client for every watch, over HTTP/2 where the API server offers it (watches share a few
/// connections: see `kube_http2`); the bearer token, when it comes from a file, is added per
/// request.
fn build_client(config: Config, token: Option<Arc<TokenFile>>) -> Result<Client, kube::Error> {
    let builder = super::http2::client_builder(config)?;
    Ok(match token {
        Some(token) => builder
            .with_layer(&tower::util::MapRequestLayer::new(
                move |mut request: http::Request<kube::client::Body>| {
                    request
                        .headers_mut()
                        .insert(http::header::AUTHORIZATION, token.header());
                    request
                },
            ))
            .build(),
        None => builder.build(),
    })
}

/// A client for `config` without a token file (the tests' scripted API server).
#[cfg(test)]
pub(crate) fn plain_client(config: Config) -> Result<Client, kube::Error> {
    build_client(config, None)
}

/// A bearer token kept in a file that may be replaced at any time (a projected service-account
/// token, a mounted secret). Read again when the last read is older than [`TOKEN_REREAD`];
/// surrounding whitespace is ignored. If a read fails, the last good token stays in use.
struct TokenFile {
    path: PathBuf,
    state: Mutex<TokenState>,
}

struct TokenState {
    header: HeaderValue,
    read_at: Instant,
    last_error: Option<String>,
}

impl TokenFile {
    fn open(path: &Path, what: &'static str) -> Result<Self, KubeError> {
        let header = read_token(path).map_err(|reason| KubeError::TokenFile {
            what,
            path: path.to_owned(),
            reason,
        })?;
        Ok(Self {
            path: path.to_owned(),
            state: Mutex::new(TokenState {
                header,
                read_at: Instant::now(),
                last_error: None,
            }),
        })
    }

    /// The `Authorization` header value to send now.
    fn header(&self) -> HeaderValue {
        let mut state = crate::locks::lock(&self.state);
        if state.read_at.elapsed() >= TOKEN_REREAD {
            state.read_at = Instant::now();
            match read_token(&self.path) {
                Ok(header) => {
                    if header != state.header {
                        tracing::info!(path = %self.path.display(), "bearer token file changed; using the new token");
                        state.header = header;
                    }
                    state.last_error = None;
                }
                Err(error) => {
                    if state.last_error.as_ref() != Some(&error) {
                        tracing::warn!(path = %self.path.display(), %error, "cannot read the bearer token file again; keeping the last token");
                        state.last_error = Some(error);
                    }
                }
            }
        }
        state.header.clone()
    }
}

fn read_token(path: &Path) -> Result<HeaderValue, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let token = text.trim();
    if token.is_empty() {
        return Err("the file is empty".to_owned());
    }
    let mut header = HeaderValue::try_from(format!("Bearer {token}"))
        .map_err(|_| "the token holds characters that cannot go into an HTTP header".to_owned())?;
    header.set_sensitive(true);
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_precedence() {
        let flag = KubeSettings {
            api_server: Some("https://127.0.0.1:6443".into()),
            ..KubeSettings::default()
        };
        let none = KubeSettings::default();
        let kubeconfig = || Some(OsString::from("/etc/kube/config"));
        let host = || Some(OsString::from("10.0.0.1"));
        assert_eq!(
            choose(&flag, kubeconfig(), host()),
            ConfigChoice::ApiServer("https://127.0.0.1:6443".into())
        );
        assert_eq!(
            choose(&none, kubeconfig(), host()),
            ConfigChoice::Kubeconfig("/etc/kube/config".into())
        );
        assert_eq!(choose(&none, None, host()), ConfigChoice::InCluster);
        assert_eq!(
            choose(&none, Some(OsString::new()), host()),
            ConfigChoice::InCluster,
            "an empty KUBECONFIG counts as unset"
        );
        assert_eq!(choose(&none, None, None), ConfigChoice::None);
        assert_eq!(
            choose(&none, None, Some(OsString::new())),
            ConfigChoice::None
        );
    }

    #[tokio::test]
    async fn no_configuration_tells_every_way_out() {
        let message = KubeError::NoConfiguration.to_string();
        for needle in [
            "KUBECONFIG",
            "inside a cluster",
            "--kube-api-server",
            "--manifests DIR",
        ] {
            assert!(message.contains(needle), "{message}");
        }
    }

    #[tokio::test]
    async fn api_server_settings_are_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let settings = |ca: Option<PathBuf>, token: Option<PathBuf>| KubeSettings {
            api_server: None,
            ca_path: ca,
            token_path: token,
        };
        let error =
            |server: &str, ca: Option<PathBuf>, token: Option<PathBuf>| match api_server_config(
                server,
                &settings(ca, token),
            ) {
                Ok(_) => panic!("{server} with these files is accepted"),
                Err(error) => error.to_string(),
            };
        let err = error("127.0.0.1:6443", None, None);
        assert!(err.contains("https://"), "{err}");

        let server = "https://127.0.0.1:6443";
        let missing = dir.path().join("missing.pem");
        let err = error(server, Some(missing.clone()), None);
        assert!(err.contains(&*missing.to_string_lossy()), "{err}");

        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "hello").expect("write");
        let err = error(server, Some(not_pem), None);
        assert!(err.contains("--kube-ca-path"), "{err}");

        let token = dir.path().join("token");
        let err = error(server, None, Some(token.clone()));
        assert!(err.starts_with("--kube-token-path"), "{err}");

        std::fs::write(&token, "abc\n").expect("write");
        let (config, token) =
            api_server_config("https://127.0.0.1:6443", &settings(None, Some(token)))
                .expect("valid");
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(token.expect("token").header(), "Bearer abc");
    }

    #[tokio::test]
    async fn broken_kubeconfig_is_an_error_naming_the_file() {
        // Exercised through the same conversion `connect` uses, without touching the
        // process environment.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("broken.kubeconfig");
        std::fs::write(&path, "clusters: [").expect("write");
        let source = Kubeconfig::read_from(&path).expect_err("does not parse");
        let err = KubeError::Kubeconfig {
            value: path.display().to_string(),
            source,
        };
        assert!(
            err.to_string()
                .starts_with(&format!("KUBECONFIG={}", path.display())),
            "{err}"
        );
    }

    #[test]
    fn token_file_is_trimmed_and_read_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, "  first\n").expect("write");
        let token = TokenFile::open(&path, "--kube-token-path").expect("readable");
        assert_eq!(token.header(), "Bearer first");
        assert!(token.header().is_sensitive());

        std::fs::write(&path, "second").expect("write");
        // Not yet re-read: the cached token is still fresh.
        assert_eq!(token.header(), "Bearer first");
        token.state.lock().expect("lock").read_at = Instant::now() - TOKEN_REREAD;
        assert_eq!(token.header(), "Bearer second");

        // A file that disappears keeps the last good token.
        std::fs::remove_file(&path).expect("remove");
        token.state.lock().expect("lock").read_at = Instant::now() - TOKEN_REREAD;
        assert_eq!(token.header(), "Bearer second");

        std::fs::write(&path, "\n").expect("write");
        let err = TokenFile::open(&path, "--kube-token-path")
            .err()
            .expect("empty");
        assert!(err.to_string().contains("empty"), "{err}");
    }
}
