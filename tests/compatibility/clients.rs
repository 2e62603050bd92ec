//! The clients: which there are, how each is launched, and what each needs.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Flagd,
    FlagdLegacy,
    Js,
    Python,
    Rust,
    Java,
    Go,
    GoLegacy,
}

pub(crate) const KINDS: [Kind; 8] = [
    Kind::Flagd,
    Kind::FlagdLegacy,
    Kind::Js,
    Kind::Python,
    Kind::Rust,
    Kind::Java,
    Kind::Go,
    Kind::GoLegacy,
];

/// How a client sends its selector (a fact of the client version, from its source).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum SelectorMode {
    /// Only the `selector` field of the request body.
    BodyOnly,
    /// The `flagd-selector` header and the body field.
    HeaderAndBody,
    /// No selector at all.
    None,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Flagd => "flagd",
            Kind::FlagdLegacy => "flagd (old, sync.v1)",
            Kind::Js => "JS provider",
            Kind::Python => "Python provider",
            Kind::Rust => "Rust provider",
            Kind::Java => "Java provider",
            Kind::Go => "Go provider",
            Kind::GoLegacy => "Go provider (old, sync.v1)",
        }
    }

    pub(crate) fn install_hint(self) -> &'static str {
        match self {
            Kind::Js | Kind::Python | Kind::Rust => "scripts/install-interop.sh",
            _ => "scripts/install-compat.sh",
        }
    }

    /// The name of the step of `scripts/install-compat.sh` that installs this client.
    pub(crate) fn compat_step(self) -> Option<&'static str> {
        match self {
            Kind::Flagd => Some("flagd"),
            Kind::FlagdLegacy => Some("flagd-legacy"),
            Kind::Java => Some("java"),
            Kind::Go => Some("go"),
            Kind::GoLegacy => Some("go-legacy"),
            Kind::Js | Kind::Python | Kind::Rust => None,
        }
    }

    pub(crate) fn selector_mode(self) -> SelectorMode {
        match self {
            Kind::Flagd | Kind::Rust | Kind::Java | Kind::GoLegacy => SelectorMode::BodyOnly,
            Kind::Js | Kind::Python | Kind::Go => SelectorMode::HeaderAndBody,
            Kind::FlagdLegacy => SelectorMode::None,
        }
    }

    /// Package and version, for the document.
    pub(crate) fn package(self, v: &Versions) -> String {
        match self {
            Kind::Flagd => format!(
                "`github.com/open-feature/flagd/flagd` {} (with `flagd/core` {})",
                v.flagd, v.flagd_core
            ),
            Kind::FlagdLegacy => format!("`github.com/open-feature/flagd` {}", v.flagd_legacy),
            Kind::Js => format!(
                "npm `@openfeature/flagd-provider` {} + `@openfeature/server-sdk` {}",
                v.js, v.js_sdk
            ),
            Kind::Python => format!(
                "PyPI `openfeature-provider-flagd` {} + `openfeature-sdk` {}",
                v.python, v.python_sdk
            ),
            Kind::Rust => format!(
                "crates.io `open-feature-flagd` {} + `open-feature` {}",
                v.rust, v.rust_sdk
            ),
            Kind::Java => format!(
                "Maven `dev.openfeature.contrib.providers:flagd` {} + `dev.openfeature:sdk` {}",
                v.java, v.java_sdk
            ),
            Kind::Go => format!(
                "`github.com/open-feature/go-sdk-contrib/providers/flagd` {} + `github.com/open-feature/go-sdk` {}",
                v.go, v.go_sdk
            ),
            Kind::GoLegacy => format!(
                "`github.com/open-feature/go-sdk-contrib/providers/flagd` {} (with `flagd/core` {}) + `github.com/open-feature/go-sdk` {}",
                v.go_legacy, v.go_legacy_core, v.go_legacy_sdk
            ),
        }
    }

    pub(crate) fn launch(self, v: &Versions) -> Result<Launch, Missing> {
        let root = repo_root();
        let cache = cache_dir();
        if let Some(step) = self.compat_step() {
            let recorded = cache.join("compat").join(format!("{step}.not-installable"));
            if let Ok(error) = std::fs::read_to_string(&recorded) {
                let error = error.split_whitespace().collect::<Vec<_>>().join(" ");
                return Err(Missing::NotInstallable(error));
            }
        }
        let file = |path: PathBuf| {
            if path.is_file() {
                Ok(path)
            } else {
                Err(Missing::NotInstalled(format!(
                    "{} is missing",
                    path.display()
                )))
            }
        };
        if matches!(self, Kind::Flagd | Kind::FlagdLegacy) && !support::skip::running_as_root() {
            return Err(Missing::NotInstalled(
                "flagd runs in a network namespace of its own (`unshare --net`), which needs root"
                    .into(),
            ));
        }
        match self {
            Kind::Flagd => Ok(Launch::Flagd {
                bin: file(cache.join(format!("bin/flagd-{}/flagd", v.flagd)))?,
                legacy: false,
            }),
            Kind::FlagdLegacy => Ok(Launch::Flagd {
                bin: file(cache.join(format!("bin/flagd-{}/flagd", v.flagd_legacy)))?,
                legacy: true,
            }),
            Kind::Js => {
                let dir = root.join("interop/js");
                if !on_path("node") {
                    return Err(Missing::NotInstalled("`node` is not on PATH".into()));
                }
                file(dir.join("node_modules/@openfeature/flagd-provider/package.json"))?;
                let mut cmd = StdCommand::new("node");
                cmd.arg(dir.join("client.mjs")).current_dir(dir);
                Ok(Launch::Stdout(cmd))
            }
            Kind::Python => {
                let python = file(cache.join("venv/bin/python"))?;
                let dir = root.join("interop/python");
                let mut cmd = StdCommand::new(python);
                cmd.arg("-u").arg(dir.join("client.py")).current_dir(dir);
                Ok(Launch::Stdout(cmd))
            }
            Kind::Rust => Ok(Launch::Stdout(StdCommand::new(file(
                cache.join("target-interop/debug/flagd-proxy-interop-rust"),
            )?))),
            Kind::Java => {
                file(cache.join("java/classes/interop/Client.class"))?;
                if !on_path("java") {
                    return Err(Missing::NotInstalled("`java` is not on PATH".into()));
                }
                let mut cmd = StdCommand::new("java");
                cmd.arg("-cp").arg(java_class_path()).arg("interop.Client");
                Ok(Launch::Stdout(cmd))
            }
            Kind::Go => Ok(Launch::Stdout(StdCommand::new(file(
                cache.join("bin/interop-go/flagd-proxy-interop-go"),
            )?))),
            Kind::GoLegacy => Ok(Launch::Stdout(StdCommand::new(file(
                cache.join("bin/interop-go-legacy/flagd-proxy-interop-go-legacy"),
            )?))),
        }
    }
}

pub(crate) enum Missing {
    /// The install script has not been run (or its output is gone).
    NotInstalled(String),
    /// The install script ran and recorded why the client cannot be installed here.
    NotInstallable(String),
}

pub(crate) enum Launch {
    /// A program speaking the READY/VALUE stdout protocol.
    Stdout(StdCommand),
    /// A flagd binary, evaluated over its HTTP API.
    Flagd { bin: PathBuf, legacy: bool },
}

impl Clone for Launch {
    fn clone(&self) -> Self {
        match self {
            Launch::Stdout(cmd) => Launch::Stdout(clone_command(cmd)),
            Launch::Flagd { bin, legacy } => Launch::Flagd {
                bin: bin.clone(),
                legacy: *legacy,
            },
        }
    }
}
