//! The control plane's certificates, token file and kubeconfigs, written before the servers
//! start (rcgen: a CA, the API server's serving certificate, the service-account key pair).

use std::collections::hash_map::RandomState;
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;

use super::{PROXY_GROUPS, PROXY_USER};

/// Files written before the servers start.
pub(super) struct Credentials {
    pub(super) ca_cert: PathBuf,
    pub(super) serving_cert: PathBuf,
    pub(super) serving_key: PathBuf,
    pub(super) sa_private_key: PathBuf,
    pub(super) sa_public_key: PathBuf,
    pub(super) token_csv: PathBuf,
    pub(super) proxy_token: PathBuf,
    pub(super) admin_kubeconfig: PathBuf,
    pub(super) proxy_kubeconfig: PathBuf,
}

/// Writes a CA, the apiserver's serving certificate, the service-account key pair, the token file
/// and both kubeconfigs into `root`.
pub(super) fn write_credentials(root: &Path, apiserver_port: u16) -> anyhow::Result<Credentials> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };

    let pki = root.join("pki");
    fs::create_dir_all(&pki).context("creating the pki directory")?;

    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).context("CA parameters")?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "flagd-proxy test control plane CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .context("self-signing the CA")?;
    let ca_issuer = Issuer::new(ca_params, ca_key);

    let serving_key = KeyPair::generate().context("generating the serving key")?;
    let mut serving_params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .context("serving certificate parameters")?;
    serving_params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving_params
        .signed_by(&serving_key, &ca_issuer)
        .context("signing the serving certificate")?;

    let sa_key = KeyPair::generate().context("generating the service-account key")?;

    let admin_token = random_token();
    let proxy_token = random_token();

    let files = Credentials {
        ca_cert: pki.join("ca.crt"),
        serving_cert: pki.join("apiserver.crt"),
        serving_key: pki.join("apiserver.key"),
        sa_private_key: pki.join("service-account.key"),
        sa_public_key: pki.join("service-account.pub"),
        token_csv: pki.join("tokens.csv"),
        proxy_token: root.join("proxy.token"),
        admin_kubeconfig: root.join("admin.kubeconfig"),
        proxy_kubeconfig: root.join("proxy.kubeconfig"),
    };
    let server = format!("https://127.0.0.1:{apiserver_port}");
    let writes: [(&Path, String); 9] = [
        (&files.ca_cert, ca_cert.pem()),
        (
            &files.serving_cert,
            format!("{}{}", serving_cert.pem(), ca_cert.pem()),
        ),
        (&files.serving_key, serving_key.serialize_pem()),
        (&files.sa_private_key, sa_key.serialize_pem()),
        (&files.sa_public_key, sa_key.public_key_pem()),
        (
            &files.token_csv,
            format!(
                "{admin_token},admin,admin-uid,\"system:masters\"\n\
                 {proxy_token},{PROXY_USER},proxy-uid,\"{}\"\n",
                PROXY_GROUPS.join(",")
            ),
        ),
        (&files.proxy_token, proxy_token.clone()),
        (
            &files.admin_kubeconfig,
            kubeconfig_yaml(&server, &files.ca_cert, "admin", &admin_token)?,
        ),
        (
            &files.proxy_kubeconfig,
            kubeconfig_yaml(&server, &files.ca_cert, "flagd-proxy", &proxy_token)?,
        ),
    ];
    for (path, contents) in writes {
        fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(files)
}

fn kubeconfig_yaml(server: &str, ca: &Path, user: &str, token: &str) -> anyhow::Result<String> {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "test-control-plane",
            "cluster": { "server": server, "certificate-authority": ca.display().to_string() },
        }],
        "users": [{ "name": user, "user": { "token": token } }],
        "contexts": [{
            "name": user,
            "context": { "cluster": "test-control-plane", "user": user, "namespace": "default" },
        }],
        "current-context": user,
    });
    serde_norway::to_string(&config).context("serialising a kubeconfig")
}

pub(super) async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<Client> {
    let kubeconfig =
        Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading {}", path.display()))?;
    Client::try_from(config).with_context(|| format!("building a client from {}", path.display()))
}

/// A hard-to-guess token; only processes on this machine ever see it.
fn random_token() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    (0..2)
        .map(|i| {
            let mut hasher = RandomState::new().build_hasher();
            hasher.write_u128(nanos);
            hasher.write_u32(std::process::id());
            hasher.write_u32(i);
            format!("{:016x}", hasher.finish())
        })
        .collect()
}
