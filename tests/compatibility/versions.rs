//! Versions of the clients, read from the files that pin them (so the document is the same
//! on every machine).

use super::*;

/// The version a `go.mod` requires of `module` (`module vX.Y.Z` on a line of its own or in a
/// require block).
pub(crate) fn go_mod_version(go_mod: &str, module: &str) -> String {
    go_mod
        .lines()
        .map(|l| l.trim().trim_start_matches("require").trim())
        .find_map(|l| {
            let mut parts = l.split_whitespace();
            (parts.next() == Some(module))
                .then(|| parts.next().map(str::to_owned))
                .flatten()
        })
        .unwrap_or_else(|| panic!("{module} is not required in the go.mod"))
}

pub(crate) fn cargo_lock_version(lock: &str, name: &str) -> String {
    let needle = format!("name = \"{name}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == needle
            && let Some(version) = lines
                .next()
                .and_then(|l| l.trim().strip_prefix("version = \""))
        {
            return version.trim_end_matches('"').to_owned();
        }
    }
    panic!("{name} is not in Cargo.lock")
}

pub(crate) fn requirement_version(requirements: &str, name: &str) -> String {
    requirements
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{name}==")))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("{name} is not pinned in requirements.txt"))
}

pub(crate) fn npm_lock_version(lock: &str, package: &str) -> String {
    let lock: Value = serde_json::from_str(lock).expect("package-lock.json");
    lock["packages"][format!("node_modules/{package}")]["version"]
        .as_str()
        .unwrap_or_else(|| panic!("{package} is not in package-lock.json"))
        .to_owned()
}

/// The `<version>` right after `<artifactId>{artifact}</artifactId>` in a pom.
pub(crate) fn pom_version(pom: &str, artifact: &str) -> String {
    let tag = format!("<artifactId>{artifact}</artifactId>");
    let rest = &pom[pom
        .find(&tag)
        .unwrap_or_else(|| panic!("{artifact} not in pom.xml"))..];
    let start = rest.find("<version>").expect("<version>") + "<version>".len();
    let end = rest[start..].find("</version>").expect("</version>");
    rest[start..start + end].trim().to_owned()
}

pub(crate) struct Versions {
    pub(crate) flagd: String,
    pub(crate) flagd_core: String,
    pub(crate) flagd_legacy: String,
    pub(crate) js: String,
    pub(crate) js_sdk: String,
    pub(crate) python: String,
    pub(crate) python_sdk: String,
    pub(crate) grpcio: String,
    pub(crate) rust: String,
    pub(crate) rust_sdk: String,
    pub(crate) java: String,
    pub(crate) java_sdk: String,
    pub(crate) go: String,
    pub(crate) go_sdk: String,
    pub(crate) go_legacy: String,
    pub(crate) go_legacy_core: String,
    pub(crate) go_legacy_sdk: String,
}

impl Versions {
    pub(crate) fn read() -> Versions {
        let flagd_mod = read_repo_file("interop/flagd/current/go.mod");
        let core_replacement = flagd_mod
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("replace github.com/open-feature/flagd/core ")
                    .and_then(|r| r.split("=>").nth(1))
                    .and_then(|r| r.split_whitespace().nth(1))
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| go_mod_version(&flagd_mod, "github.com/open-feature/flagd/core"));
        let js_lock = read_repo_file("interop/js/package-lock.json");
        let requirements = read_repo_file("interop/python/requirements.txt");
        let cargo_lock = read_repo_file("interop/rust/Cargo.lock");
        let pom = read_repo_file("interop/java/pom.xml");
        let go_mod = read_repo_file("interop/go/go.mod");
        let go_legacy_mod = read_repo_file("interop/go/legacy/go.mod");
        Versions {
            flagd: go_mod_version(&flagd_mod, "github.com/open-feature/flagd/flagd"),
            flagd_core: core_replacement,
            flagd_legacy: go_mod_version(
                &read_repo_file("interop/flagd/legacy/go.mod"),
                "github.com/open-feature/flagd",
            ),
            js: npm_lock_version(&js_lock, "@openfeature/flagd-provider"),
            js_sdk: npm_lock_version(&js_lock, "@openfeature/server-sdk"),
            python: requirement_version(&requirements, "openfeature-provider-flagd"),
            python_sdk: requirement_version(&requirements, "openfeature-sdk"),
            grpcio: requirement_version(&requirements, "grpcio"),
            rust: cargo_lock_version(&cargo_lock, "open-feature-flagd"),
            rust_sdk: cargo_lock_version(&cargo_lock, "open-feature"),
            java: pom_version(&pom, "flagd"),
            java_sdk: pom_version(&pom, "sdk"),
            go: go_mod_version(
                &go_mod,
                "github.com/open-feature/go-sdk-contrib/providers/flagd",
            ),
            go_sdk: go_mod_version(&go_mod, "github.com/open-feature/go-sdk"),
            go_legacy: go_mod_version(
                &go_legacy_mod,
                "github.com/open-feature/go-sdk-contrib/providers/flagd",
            ),
            go_legacy_core: go_mod_version(&go_legacy_mod, "github.com/open-feature/flagd/core"),
            go_legacy_sdk: go_mod_version(&go_legacy_mod, "github.com/open-feature/go-sdk"),
        }
    }
}
