//! The choices of the command line that the scenarios read: which source the proxies watch,
//! which authorization mode the authorization storm runs the proxy in, and the chart's tiers
//! the attacks run at.

/// Where the proxies read their flags from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum SourceKind {
    Files,
    Kubernetes,
}

impl SourceKind {
    pub(crate) fn label(self) -> &'static str {
        match self {
            SourceKind::Files => "files",
            SourceKind::Kubernetes => "kubernetes",
        }
    }
}

/// An authorization mode of the proxy, and how its clients identify.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum AuthzMode {
    /// `--authz none`: no identity asked for.
    None,
    /// `--authz namespace`, clients present their ServiceAccount token.
    NamespaceToken,
    /// `--authz rbac`, clients present their ServiceAccount token.
    RbacToken,
    /// `--authz namespace --authz-pod-ip`: clients are known by their pod's address.
    NamespacePodIp,
    /// `--authz rbac --authz-pod-ip`: clients are known by their pod's address.
    RbacPodIp,
}

impl AuthzMode {
    pub(crate) fn label(self) -> &'static str {
        match self {
            AuthzMode::None => "none",
            AuthzMode::NamespaceToken => "namespace, token",
            AuthzMode::RbacToken => "rbac, token",
            AuthzMode::NamespacePodIp => "namespace, pod address",
            AuthzMode::RbacPodIp => "rbac, pod address",
        }
    }

    pub(crate) fn proxy_args(self) -> &'static [&'static str] {
        match self {
            AuthzMode::None => &["--authz", "none"],
            AuthzMode::NamespaceToken => &["--authz", "namespace"],
            AuthzMode::RbacToken => &["--authz", "rbac"],
            AuthzMode::NamespacePodIp => &["--authz", "namespace", "--authz-pod-ip"],
            AuthzMode::RbacPodIp => &["--authz", "rbac", "--authz-pod-ip"],
        }
    }

    pub(crate) fn tokens(self) -> bool {
        matches!(self, AuthzMode::NamespaceToken | AuthzMode::RbacToken)
    }

    pub(crate) fn pod_ip(self) -> bool {
        matches!(self, AuthzMode::NamespacePodIp | AuthzMode::RbacPodIp)
    }
}

/// A tier of the chart: its container's memory limit, and the budget the chart derives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Tier {
    /// The node tier: 64 MiB, budget 36Mi.
    Node,
    /// The central tier: 544 MiB, budget 396Mi.
    Central,
}

impl Tier {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Tier::Node => "node",
            Tier::Central => "central",
        }
    }

    pub(crate) fn limit_bytes(self) -> u64 {
        match self {
            Tier::Node => 64 << 20,
            Tier::Central => 544 << 20,
        }
    }

    /// `--memory-budget`, as the chart derives it from the limit.
    pub(crate) fn budget(self) -> &'static str {
        match self {
            Tier::Node => "36Mi",
            Tier::Central => "396Mi",
        }
    }
}
