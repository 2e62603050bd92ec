//! The helm program: where it comes from, and `helm lint` / `helm template` in a home of
//! its own.

use super::*;

pub(crate) struct Helm {
    pub(crate) binary: PathBuf,
    /// HELM_CACHE_HOME, HELM_CONFIG_HOME and HELM_DATA_HOME: nothing of the user's is read or
    /// written.
    pub(crate) home: tempfile::TempDir,
}

/// The output of one helm run.
pub(crate) struct Run {
    pub(crate) ok: bool,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    /// Panics with both outputs unless the run succeeded; `what` names it.
    pub(crate) fn assert_ok(&self, what: &str) {
        assert!(self.ok, "{what}:\n{}\n{}", self.stdout, self.stderr);
    }
}

impl Helm {
    /// Finds helm (the test kit's one rule), or skips the calling test (a failure under `CI`).
    pub(crate) fn find_or_skip() -> Option<Helm> {
        support::skip::require(support::helm::find()).map(|binary| Helm {
            binary,
            home: tempfile::tempdir().expect("tempdir"),
        })
    }

    pub(crate) fn run(&self, args: &[String], kubeconfig: Option<&Path>) -> Run {
        let home = self.home.path();
        let mut command = Command::new(&self.binary);
        command
            .args(args)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env_remove("HELM_KUBECONTEXT")
            .env_remove("HELM_NAMESPACE");
        match kubeconfig {
            Some(path) => command.env("KUBECONFIG", path),
            // No cluster: render with helm's built-in capabilities only.
            None => command.env("KUBECONFIG", home.join("no-kubeconfig")),
        };
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.binary.display()));
        Run {
            ok: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    pub(crate) fn lint(&self, case: &Case) {
        let mut args = strings(&["lint", &chart_dir(), "--strict", "--namespace", &case.ns()]);
        args.extend(case.set_args());
        let run = self.run(&args, None);
        assert!(
            run.ok,
            "helm lint failed for case {}:\n{}\n{}",
            case.name, run.stdout, run.stderr
        );
    }

    pub(crate) fn template_run(&self, release: &str, ns: &str, sets: &[String]) -> Run {
        let mut args = strings(&["template", release, &chart_dir(), "--namespace", ns]);
        args.extend(sets.iter().cloned());
        self.run(&args, None)
    }

    /// `helm template` for a case, parsed into objects.
    pub(crate) fn template(&self, case: &Case) -> Vec<Value> {
        let run = self.template_run(RELEASE, &case.ns(), &case.set_args());
        assert!(
            run.ok,
            "helm template failed for case {}:\n{}",
            case.name, run.stderr
        );
        parse_documents(&run.stdout)
    }
}

pub(crate) fn chart_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("charts")
        .join("flagd-proxy")
        .display()
        .to_string()
}

pub(crate) fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// Every non-empty YAML document of a rendered chart.
pub(crate) fn parse_documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|document| Value::deserialize(document).expect("rendered YAML parses"))
        .filter(|value| !value.is_null())
        .collect()
}
