//! The ways of installing the chart that the tests render and apply.

pub(crate) const RELEASE: &str = "flagd-proxy";

/// One way of installing the chart.
pub(crate) struct Case {
    pub(crate) name: &'static str,
    pub(crate) mode: &'static str,
    pub(crate) sets: Vec<(&'static str, &'static str)>,
}

impl Case {
    pub(crate) fn new(
        name: &'static str,
        mode: &'static str,
        sets: &[(&'static str, &'static str)],
    ) -> Case {
        Case {
            name,
            mode,
            sets: sets.to_vec(),
        }
    }

    /// The namespace the case installs into (also its own namespace in the test apiserver).
    pub(crate) fn ns(&self) -> String {
        format!("helm-{}", self.name)
    }

    pub(crate) fn set_args(&self) -> Vec<String> {
        let mut args = vec!["--set".to_owned(), format!("mode={}", self.mode)];
        for (key, value) in &self.sets {
            args.push("--set".to_owned());
            args.push(format!("{key}={value}"));
        }
        args
    }

    pub(crate) fn value(&self, key: &str) -> Option<&str> {
        self.sets.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    pub(crate) fn flag(&self, key: &str) -> bool {
        self.value(key) == Some("true")
    }

    pub(crate) fn central(&self) -> bool {
        matches!(self.mode, "central" | "both")
    }

    pub(crate) fn node(&self) -> bool {
        matches!(self.mode, "node" | "both")
    }

    pub(crate) fn central_tls(&self) -> bool {
        self.central() && self.flag("tls.enabled")
    }

    pub(crate) fn node_tls(&self) -> bool {
        self.node() && self.flag("node.tls.enabled")
    }

    pub(crate) fn cert_manager(&self) -> bool {
        self.flag("tls.certManager.enabled")
    }

    pub(crate) fn upstream_tls(&self) -> bool {
        self.node()
            && (self.flag("node.upstream.tls")
                || self.value("node.upstream.ca.secretName").is_some()
                || (self.mode == "both" && self.flag("tls.enabled")))
    }

    /// The CA Secret the node tier mounts, if any.
    pub(crate) fn upstream_ca_secret(&self) -> Option<String> {
        if !self.upstream_tls() || self.flag("node.upstream.ca.systemRoots") {
            return None;
        }
        match self.value("node.upstream.ca.secretName") {
            Some(name) => Some(name.to_owned()),
            None => (self.mode == "both").then(|| format!("{RELEASE}-tls")),
        }
    }

    pub(crate) fn expected_upstream(&self) -> String {
        match self.value("node.upstream.address") {
            Some(address) => address.to_owned(),
            None => format!("flagd-proxy-svc.{}.svc.cluster.local:8015", self.ns()),
        }
    }
}

pub(crate) const CENTRAL_UPSTREAM: &str = "flagd-proxy-svc.flagd-proxy.svc.cluster.local:8015";

pub(crate) fn cases() -> Vec<Case> {
    vec![
        Case::new("central", "central", &[]),
        Case::new(
            "central-tls",
            "central",
            &[
                ("tls.enabled", "true"),
                ("tls.secretName", "proxy-serving"),
                ("central.replicas", "3"),
                ("central.maxConnectionAge", "30m"),
                ("central.maxConnectionAgeGrace", "15s"),
                ("central.events.enabled", "false"),
                ("logFormat", "json"),
                ("compression.mode", "off"),
                ("compression.minBytes", "4096"),
                ("compression.level", "1"),
            ],
        ),
        Case::new(
            "central-certmanager",
            "central",
            &[
                ("tls.enabled", "true"),
                ("tls.certManager.enabled", "true"),
                ("tls.certManager.issuerRef.name", "internal-ca"),
                ("tls.certManager.issuerRef.kind", "ClusterIssuer"),
                ("serviceMonitor.enabled", "true"),
                ("serviceMonitor.labels.release", "prometheus"),
                ("prometheusRule.enabled", "true"),
                ("prometheusRule.labels.release", "prometheus"),
                ("dashboard.enabled", "true"),
            ],
        ),
        Case::new(
            "node",
            "node",
            &[("node.upstream.address", CENTRAL_UPSTREAM)],
        ),
        Case::new(
            "node-tls",
            "node",
            &[
                ("node.upstream.address", CENTRAL_UPSTREAM),
                ("node.upstream.ca.secretName", "central-ca"),
                ("node.tls.enabled", "true"),
                ("tls.certManager.enabled", "true"),
                ("tls.certManager.issuerRef.name", "internal-ca"),
                ("serviceMonitor.enabled", "true"),
            ],
        ),
        Case::new("both", "both", &[("central.maxConnectionAge", "10m")]),
        // OpenTelemetry export from both tiers, with headers and a CA from Secrets.
        Case::new(
            "both-otlp",
            "both",
            &[
                ("otlp.endpoint", "https://otel-collector.monitoring:4317"),
                ("otlp.interval", "10s"),
                ("otlp.headersSecret.name", "otlp-headers"),
                ("otlp.ca.secretName", "collector-ca"),
                ("otlp.resourceAttributes.deployment\\.environment", "prod"),
            ],
        ),
        Case::new(
            "both-tls",
            "both",
            &[
                ("tls.enabled", "true"),
                ("tls.certManager.enabled", "true"),
                ("tls.certManager.issuerRef.name", "internal-ca"),
                ("node.tls.enabled", "true"),
                ("serviceMonitor.enabled", "true"),
                (
                    "networkPolicy.clients.namespaceSelector.matchLabels.flagd-proxy/clients",
                    "allowed",
                ),
            ],
        ),
        // A platform that picks the user itself, a pinned digest, system roots for the upstream.
        Case::new(
            "both-systemroots",
            "both",
            &[
                ("tls.enabled", "true"),
                ("node.upstream.ca.systemRoots", "true"),
                ("securityContext.runAsUser", "null"),
                ("securityContext.runAsGroup", "null"),
                ("securityContext.fsGroup", "null"),
                (
                    "image.digest",
                    "sha256:0000000000000000000000000000000000000000000000000000000000000000",
                ),
                ("networkPolicy.enabled", "false"),
                ("metrics.service.enabled", "false"),
            ],
        ),
    ]
}
