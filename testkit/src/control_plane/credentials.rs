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
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
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

/// A certificate authority that signs leaf certificates (ECDSA P-256).
pub(crate) struct Ca {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// What a leaf certificate is for.
pub(crate) struct Leaf<'a> {
    pub(crate) common_name: &'a str,
    /// Organizations (Kubernetes reads them as groups).
    pub(crate) organizations: &'a [&'a str],
    pub(crate) server: bool,
    pub(crate) client: bool,
    /// DNS names and IP addresses.
    pub(crate) names: &'a [&'a str],
}

impl Ca {
    pub(crate) fn new(common_name: &str) -> anyhow::Result<Ca> {
        let key = KeyPair::generate().context("generating the CA key")?;
        let mut params = CertificateParams::new(Vec::<String>::new()).context("CA parameters")?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).context("self-signing the CA")?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA's certificate (PEM).
    pub(crate) fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key (PKCS#8 PEM).
    pub(crate) fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A new key and a certificate for it signed by this CA: (certificate PEM, key PEM).
    pub(crate) fn sign(&self, leaf: &Leaf<'_>) -> anyhow::Result<(String, String)> {
        let what = leaf.common_name;
        let key = KeyPair::generate().with_context(|| format!("generating the key of {what}"))?;
        let names = leaf.names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let mut params = CertificateParams::new(names)
            .with_context(|| format!("certificate parameters of {what}"))?;
        for organization in leaf.organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *organization);
        }
        params
            .distinguished_name
            .push(DnType::CommonName, leaf.common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = [
            (leaf.server, ExtendedKeyUsagePurpose::ServerAuth),
            (leaf.client, ExtendedKeyUsagePurpose::ClientAuth),
        ]
        .into_iter()
        .filter_map(|(wanted, purpose)| wanted.then_some(purpose))
        .collect();
        let cert = params
            .signed_by(&key, &self.issuer)
            .with_context(|| format!("signing the certificate of {what}"))?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// Writes a CA, the apiserver's serving certificate, the service-account key pair, the token file
/// and both kubeconfigs into `root`.
pub(super) fn write_credentials(root: &Path, apiserver_port: u16) -> anyhow::Result<Credentials> {
    let pki = root.join("pki");
    fs::create_dir_all(&pki).context("creating the pki directory")?;

    let ca = Ca::new("flagd-proxy test control plane CA")?;
    let (serving_cert, serving_key) = ca.sign(&Leaf {
        common_name: "kube-apiserver",
        organizations: &[],
        server: true,
        client: false,
        names: &["127.0.0.1", "localhost"],
    })?;

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
        (&files.ca_cert, ca.cert_pem().to_owned()),
        (
            &files.serving_cert,
            format!("{serving_cert}{}", ca.cert_pem()),
        ),
        (&files.serving_key, serving_key),
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

/// Where a cluster's components reach its API server, and the names its certificates carry.
pub(crate) struct ClusterIdentity<'a> {
    /// The node's name (the kubelet's identity `system:node:<node>`).
    pub(crate) node: &'a str,
    /// The node's address: where the API server and the kubelet listen.
    pub(crate) node_ip: &'a str,
    /// The `kubernetes` Service's address (the first of the Service range).
    pub(crate) service_ip: &'a str,
}

/// The PKI of a whole cluster, under `dir/pki`: a CA (`ca.crt`, `ca.key`, which the controller
/// manager signs with), the API server's serving certificate, its client certificate for
/// kubelets, the kubelet's serving-and-client certificate, client certificates for the admin, the
/// controller manager, the scheduler and kube-proxy, and the service-account key pair (`sa.key`,
/// `sa.pub`); plus `dir/<user>.kubeconfig` for each client (`admin`, `kubelet`,
/// `controller-manager`, `scheduler`, `kube-proxy`), pointing at `https://<node_ip>:6443`.
pub(crate) fn write_cluster_pki(dir: &Path, id: &ClusterIdentity<'_>) -> anyhow::Result<()> {
    let pki = dir.join("pki");
    fs::create_dir_all(&pki).with_context(|| format!("creating {}", pki.display()))?;
    let write = |name: &str, contents: &str| {
        let path = pki.join(name);
        fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))
    };
    let ca = Ca::new("flagd-proxy-cluster-ca")?;
    write("ca.crt", ca.cert_pem())?;
    write("ca.key", ca.key_pem())?;
    let node_user = format!("system:node:{}", id.node);
    let apiserver_names = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "localhost",
        "127.0.0.1",
        id.node_ip,
        id.service_ip,
    ];
    let client = |common_name, organizations| Leaf {
        common_name,
        organizations,
        server: false,
        client: true,
        names: &[],
    };
    let leaves = [
        (
            "apiserver",
            Leaf {
                common_name: "kube-apiserver",
                organizations: &[],
                server: true,
                client: false,
                names: &apiserver_names,
            },
        ),
        (
            "kubelet",
            Leaf {
                common_name: &node_user,
                organizations: &["system:nodes"],
                server: true,
                client: true,
                names: &[id.node, id.node_ip],
            },
        ),
        (
            "apiserver-kubelet-client",
            client("kube-apiserver-kubelet-client", &["system:masters"]),
        ),
        ("admin", client("cluster-admin", &["system:masters"])),
        (
            "controller-manager",
            client("system:kube-controller-manager", &[]),
        ),
        ("scheduler", client("system:kube-scheduler", &[])),
        ("kube-proxy", client("system:kube-proxy", &[])),
    ];
    for (file, leaf) in leaves {
        let (cert, key) = ca.sign(&leaf)?;
        write(&format!("{file}.crt"), &cert)?;
        write(&format!("{file}.key"), &key)?;
    }
    let sa_key = KeyPair::generate().context("generating the service-account key")?;
    write("sa.key", &sa_key.serialize_pem())?;
    write("sa.pub", &sa_key.public_key_pem())?;

    let server = format!("https://{}:6443", id.node_ip);
    for user in [
        "admin",
        "kubelet",
        "controller-manager",
        "scheduler",
        "kube-proxy",
    ] {
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{
                "name": "cluster",
                "cluster": { "server": server, "certificate-authority": pki.join("ca.crt") },
            }],
            "users": [{ "name": user, "user": {
                "client-certificate": pki.join(format!("{user}.crt")),
                "client-key": pki.join(format!("{user}.key")),
            }}],
            "contexts": [{ "name": "default", "context": { "cluster": "cluster", "user": user } }],
            "current-context": "default",
        });
        let path = dir.join(format!("{user}.kubeconfig"));
        let yaml = serde_norway::to_string(&config).context("serialising a kubeconfig")?;
        fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::RootCertStore;
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::server::WebPkiClientVerifier;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

    use super::*;

    const CLIENTS: [&str; 5] = [
        "admin",
        "kubelet",
        "controller-manager",
        "scheduler",
        "kube-proxy",
    ];

    fn cert(dir: &Path, name: &str) -> CertificateDer<'static> {
        let path = dir.join("pki").join(format!("{name}.crt"));
        CertificateDer::from_pem_file(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    }

    #[test]
    fn cluster_certificates_verify_for_the_names_and_uses_its_components_need() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dir = dir.path();
        write_cluster_pki(
            dir,
            &ClusterIdentity {
                node: "node1",
                node_ip: "10.99.0.1",
                service_ip: "10.96.0.1",
            },
        )
        .expect("write the cluster's PKI");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        roots.add(cert(dir, "ca")).expect("the CA certificate");
        let roots = Arc::new(roots);
        let servers = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .expect("a server verifier");
        let now = UnixTime::now();
        let serves = |file: &str, name: &str| {
            let name = ServerName::try_from(name.to_owned()).expect("a server name");
            servers.verify_server_cert(&cert(dir, file), &[], &name, &[], now)
        };
        for name in [
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "10.99.0.1",
            "10.96.0.1",
            "127.0.0.1",
        ] {
            serves("apiserver", name)
                .unwrap_or_else(|e| panic!("the API server's certificate for {name}: {e}"));
        }
        assert!(serves("apiserver", "10.99.0.2").is_err());
        serves("kubelet", "10.99.0.1").expect("the kubelet's certificate for its address");
        serves("kubelet", "node1").expect("the kubelet's certificate for its name");
        assert!(serves("admin", "10.99.0.1").is_err());

        let clients = WebPkiClientVerifier::builder_with_provider(roots, provider)
            .build()
            .expect("a client verifier");
        for name in CLIENTS.iter().chain(&["apiserver-kubelet-client"]) {
            clients
                .verify_client_cert(&cert(dir, name), &[], now)
                .unwrap_or_else(|e| panic!("{name}'s client certificate: {e}"));
        }
        assert!(
            clients
                .verify_client_cert(&cert(dir, "apiserver"), &[], now)
                .is_err()
        );

        for user in CLIENTS {
            let path = dir.join(format!("{user}.kubeconfig"));
            let config = Kubeconfig::read_from(&path).expect("a kubeconfig");
            let auth = config.auth_infos[0].auth_info.as_ref().expect("a user");
            let files = [
                auth.client_certificate.as_deref(),
                auth.client_key.as_deref(),
            ];
            for file in files {
                let file = file.unwrap_or_else(|| panic!("{} names its files", path.display()));
                assert!(Path::new(file).is_file(), "{file} of {}", path.display());
            }
            let cluster = config.clusters[0].cluster.as_ref().expect("a cluster");
            assert_eq!(cluster.server.as_deref(), Some("https://10.99.0.1:6443"));
        }
    }
}
