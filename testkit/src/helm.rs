//! `helm template` of the chart in `charts/flagd-proxy`, for render tests that need no cluster.
//!
//! helm comes from `FLAGD_PROXY_HELM`, the cache (`scripts/install-helm.sh`), or `PATH` ([`find`]).
//! Without it the caller is skipped ([`crate::skip`]), or fails when `CI` is set.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

use super::control_plane::cache_dir;

/// A helm binary with homes of its own: nothing of the user's is read or written.
pub struct ChartRenderer {
    binary: PathBuf,
    home: tempfile::TempDir,
}

/// The helm binary every test uses: `$FLAGD_PROXY_HELM` (which must work), else the cache's
/// `bin/helm` (`scripts/install-helm.sh`), else `helm` on `PATH`; the error says where it looked.
pub fn find() -> Result<PathBuf, String> {
    let works = |path: &Path| {
        Command::new(path)
            .args(["version", "--short"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if let Some(path) = std::env::var_os("FLAGD_PROXY_HELM").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        return if works(&path) {
            Ok(path)
        } else {
            Err(format!(
                "FLAGD_PROXY_HELM={} does not run `helm version`",
                path.display()
            ))
        };
    }
    let cached = cache_dir().join("bin/helm");
    [cached.clone(), PathBuf::from("helm")]
        .into_iter()
        .find(|path| works(path))
        .ok_or_else(|| {
            format!(
                "helm not found (looked at $FLAGD_PROXY_HELM, {}, and PATH); run \
                 scripts/install-helm.sh",
                cached.display()
            )
        })
}

impl ChartRenderer {
    /// Finds helm ([`find`]), or [`skip`](crate::skip::skip)s the calling test.
    pub fn find_or_skip() -> Option<ChartRenderer> {
        crate::skip::require(find()).map(|binary| ChartRenderer {
            binary,
            home: tempfile::tempdir().expect("tempdir"),
        })
    }

    /// `helm template RELEASE charts/flagd-proxy --namespace NS --set S...`: the rendered
    /// objects, or helm's error output.
    pub fn template(&self, release: &str, ns: &str, sets: &[&str]) -> Result<Vec<Value>, String> {
        let chart = crate::repo_root().join("charts/flagd-proxy");
        let home = self.home.path();
        let mut command = Command::new(&self.binary);
        command
            .arg("template")
            .arg(release)
            .arg(&chart)
            .args(["--namespace", ns])
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env("KUBECONFIG", home.join("no-kubeconfig"))
            .env_remove("HELM_KUBECONTEXT")
            .env_remove("HELM_NAMESPACE");
        for set in sets {
            command.args(["--set", set]);
        }
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.binary.display()));
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        let text = String::from_utf8_lossy(&output.stdout);
        Ok(serde_norway::Deserializer::from_str(&text)
            .map(|document| Value::deserialize(document).expect("rendered YAML parses"))
            .filter(|value| !value.is_null())
            .collect())
    }

    /// [`Self::template`] that must succeed.
    pub fn render(&self, release: &str, ns: &str, sets: &[&str]) -> Vec<Value> {
        self.template(release, ns, sets)
            .unwrap_or_else(|e| panic!("helm template {sets:?}: {e}"))
    }

    /// [`Self::template`] that must fail, saying `want`.
    pub fn assert_refused(&self, release: &str, ns: &str, sets: &[&str], want: &str) {
        match self.template(release, ns, sets) {
            Ok(_) => panic!("{sets:?} rendered"),
            Err(error) => assert!(error.contains(want), "{sets:?}: {error}"),
        }
    }
}

/// The port named `name` of a Service object (as `helm template` renders it or the API server
/// returns it); panics when it has none.
pub fn service_port<'a>(service: &'a Value, name: &str) -> &'a Value {
    service["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("the Service has no port {name:?}: {service}"))
}
