//! Where the test binaries and the downloaded test data are: the cache directory, the server
//! binaries of the control plane, and the files `scripts/fetch-test-data.sh` fetched.

use std::fmt;
use std::path::{Path, PathBuf};

use super::ControlPlaneError;

/// Paths of the two server binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub kube_apiserver: PathBuf,
    pub etcd: PathBuf,
}

/// The directory the binaries are taken from: `FLAGD_PROXY_KUBE_BIN_DIR`, else
/// `${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}/bin`.
pub fn bin_dir() -> PathBuf {
    match non_empty_env("FLAGD_PROXY_KUBE_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => cache_dir().join("bin"),
    }
}

/// Where the test installers keep what they build and fetch:
/// `${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}`.
pub fn cache_dir() -> PathBuf {
    match non_empty_env("FLAGD_PROXY_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home = non_empty_env("HOME").unwrap_or_else(|| "/root".to_owned());
            Path::new(&home).join(".cache").join("flagd-proxy")
        }
    }
}

/// The class path of the Java interop programs that `scripts/install-compat.sh java` builds into
/// `<cache>/java`: their classes and the jars they run with.
pub fn java_class_path() -> String {
    let java = cache_dir().join("java");
    format!(
        "{}:{}/*",
        java.join("classes").display(),
        java.join("lib").display()
    )
}

/// Public data a test reads that is not kept in the repository and is not in the cache.
#[derive(Debug)]
pub struct TestDataMissing {
    pub path: PathBuf,
}

impl fmt::Display for TestDataMissing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "test data {} is missing; run scripts/fetch-test-data.sh (it downloads the modules \
             listed in tests/data/modules.txt with `go mod download` and links them under \
             ${{FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}}/test-data)",
            self.path.display()
        )
    }
}

impl std::error::Error for TestDataMissing {}

/// The one place that resolves downloaded test data: `relative` under the folder
/// `scripts/fetch-test-data.sh` fills (`$FLAGD_PROXY_TEST_DATA`, else `<cache>/test-data`), e.g.
/// `flagd-schemas/json/test/flags` or `open-feature-operator/config/crd/bases`.
pub fn test_data(relative: &str) -> Result<PathBuf, TestDataMissing> {
    let root = match non_empty_env("FLAGD_PROXY_TEST_DATA") {
        Some(dir) => PathBuf::from(dir),
        None => cache_dir().join("test-data"),
    };
    let path = root.join(relative);
    if path.exists() {
        Ok(path)
    } else {
        Err(TestDataMissing { path })
    }
}

/// [`test_data`] for a test that cannot run without it: panics under `CI`, else prints a skip
/// notice and returns `None`.
pub fn test_data_or_skip(relative: &str) -> Option<PathBuf> {
    crate::skip::require(test_data(relative))
}

/// Looks for `kube-apiserver` and `etcd` in `dir`.
pub fn find_binaries(dir: &Path) -> Result<Binaries, ControlPlaneError> {
    let kube_apiserver = dir.join("kube-apiserver");
    let etcd = dir.join("etcd");
    let missing: Vec<PathBuf> = [&kube_apiserver, &etcd]
        .into_iter()
        .filter(|p| !p.is_file())
        .cloned()
        .collect();
    if missing.is_empty() {
        Ok(Binaries {
            kube_apiserver,
            etcd,
        })
    } else {
        Err(ControlPlaneError::BinariesMissing {
            bin_dir: dir.to_path_buf(),
            missing,
        })
    }
}

pub(super) fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}
