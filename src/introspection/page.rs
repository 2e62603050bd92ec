//! The `/status` page: every watched resource with its state, and the source's own report.
//!
//! The management port writes a [`StatusPage`]; `flagd-proxy status`, the tests and the
//! benchmark read the same type, so a field renamed here is renamed for every reader at once
//! (or fails to build where one is used). Field names are the page's JSON names in camelCase,
//! and fields are declared in the order of those names, the order the page has always been
//! written in. Fields added since the first release default when absent, so an older proxy's
//! page still reads.
use serde::{Deserialize, Serialize};

/// The answer of `/status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusPage {
    /// What `/readyz` says.
    pub ready: bool,
    /// Every watched resource.
    #[serde(default)]
    pub resources: Vec<ResourceStatus>,
    /// The source's name (`kubernetes`, `manifests`, `upstream`).
    pub source: String,
    /// The source's own report.
    #[serde(default)]
    pub source_status: SourceStatus,
}

impl StatusPage {
    /// The watched resource `selector` (`core.openfeature.dev/namespace/name`), if it is watched.
    pub fn resource(&self, selector: &str) -> Option<&ResourceStatus> {
        self.resources.iter().find(|r| r.selector == selector)
    }
}

/// One watched resource.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceStatus {
    /// `pending`, `present`, `absent`, `invalid`, `forbidden`, `unreachable` or `refused`.
    pub availability: String,
    /// The size of the flag configuration clients get, in bytes (none before the first version).
    pub bytes: Option<u64>,
    /// Why the resource is not served as it is now (the newest version refused, the source
    /// unreachable, no permission).
    pub reason: Option<String>,
    /// `core.openfeature.dev/namespace/name`.
    pub selector: String,
    /// The version clients get is kept from an earlier run (`--state-dir`): the source has not
    /// delivered one since the proxy started watching the resource.
    #[serde(default)]
    pub stale: bool,
    /// Open streams on the resource.
    pub subscribers: u64,
    /// The version clients get (none before the first one).
    pub version: Option<u64>,
    /// How long ago the source changed to that version.
    #[serde(default)]
    pub version_age_seconds: Option<f64>,
    /// What clients report about some flags of the version they get (it is served all the
    /// same).
    #[serde(default)]
    pub warnings: Option<String>,
}

/// The source's own report: which source it is shaped by. Written as the source's object, or
/// `null` for a source with nothing to report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SourceStatus {
    Manifests(ManifestsStatus),
    Kubernetes(KubernetesStatus),
    Upstream(UpstreamStatus),
    #[default]
    Unreported,
}

impl SourceStatus {
    /// The files that do not parse (none but for manifest files).
    pub fn problems(&self) -> &[FileProblem] {
        match self {
            Self::Manifests(manifests) => &manifests.problems,
            _ => &[],
        }
    }
}

/// Manifest files: what they hold, and the files that do not parse.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestsStatus {
    #[serde(default)]
    pub problems: Vec<FileProblem>,
    /// How many resources the files hold.
    pub resources: u64,
    /// The first selectors of those resources, in order (at most 20).
    #[serde(default)]
    pub selectors: Vec<String>,
}

/// A file that does not parse, or cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileProblem {
    pub error: String,
    /// The file's path (characters that are not UTF-8 replaced).
    pub path: String,
}

/// The Kubernetes API server watched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesStatus {
    /// Its URL.
    pub api_server: String,
    /// Where its address and credentials came from (`--kube-api-server`, `KUBECONFIG`, `in-cluster`).
    pub configured_by: String,
    /// The resource watched: `featureflags.core.openfeature.dev/v1beta1`.
    pub resource: String,
}

/// The proxy this one is a node tier of (`--upstream`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamStatus {
    /// Its address.
    pub upstream: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages as the management port wrote them before this type: the JSON names, their order
    /// and `null` for what is unknown are kept byte for byte.
    #[test]
    fn pages_of_every_source_read_and_write_back_unchanged() {
        let resource = r#"{"availability":"invalid","bytes":42,"reason":"bad flag","selector":"core.openfeature.dev/default/demo","stale":true,"subscribers":2,"version":3,"versionAgeSeconds":1.5,"warnings":"flag f: odd"}"#;
        let unseen = r#"{"availability":"pending","bytes":null,"reason":null,"selector":"core.openfeature.dev/a/b","stale":false,"subscribers":0,"version":null,"versionAgeSeconds":null,"warnings":null}"#;
        for (source, source_status) in [
            (
                "manifests",
                r#"{"problems":[{"error":"not YAML","path":"/flags/x.yaml"}],"resources":1,"selectors":["core.openfeature.dev/default/demo"]}"#,
            ),
            (
                "kubernetes",
                r#"{"apiServer":"https://10.0.0.1","configuredBy":"in-cluster","resource":"featureflags.core.openfeature.dev/v1beta1"}"#,
            ),
            ("upstream", r#"{"upstream":"central:8015"}"#),
            ("fake", "null"),
        ] {
            let text = format!(
                r#"{{"ready":true,"resources":[{resource},{unseen}],"source":"{source}","sourceStatus":{source_status}}}"#
            );
            let page: StatusPage = serde_json::from_str(&text).expect(source);
            assert_eq!(serde_json::to_string(&page).expect("JSON"), text);
            let kind = match &page.source_status {
                SourceStatus::Manifests(_) => "manifests",
                SourceStatus::Kubernetes(_) => "kubernetes",
                SourceStatus::Upstream(_) => "upstream",
                SourceStatus::Unreported => "fake",
            };
            assert_eq!(kind, source);
        }
    }

    #[test]
    fn a_page_without_the_fields_added_later_reads() {
        let page: StatusPage = serde_json::from_str(
            r#"{"ready":false,"source":"manifests","resources":[{"selector":"s","availability":"present","reason":null,"version":1,"bytes":2,"subscribers":0}]}"#,
        )
        .expect("an older page");
        assert_eq!(page.source_status, SourceStatus::Unreported);
        let resource = page.resource("s").expect("s");
        assert!(!resource.stale);
        assert_eq!(resource.version_age_seconds, None);
        assert_eq!(resource.warnings, None);
        assert!(page.resource("t").is_none());
    }

    #[test]
    fn only_manifest_files_have_problems() {
        let problem = FileProblem {
            error: "not YAML".into(),
            path: "/flags/x.yaml".into(),
        };
        let manifests = SourceStatus::Manifests(ManifestsStatus {
            problems: vec![problem.clone()],
            resources: 0,
            selectors: Vec::new(),
        });
        assert_eq!(manifests.problems(), [problem]);
        let upstream = SourceStatus::Upstream(UpstreamStatus {
            upstream: "central:8015".into(),
        });
        assert!(upstream.problems().is_empty());
    }
}
