//! What a failed watch means: the kind of failure (as counted in
//! `flagd_proxy_source_errors_total{source="kubernetes"}`), a message that tells an operator what
//! to do, and when a refusal (403) is believed.
use kube::runtime::watcher;

use super::{PLURAL, VERSION};
use crate::selector::{GROUP, ResourceKey};

/// Refusals in a row that end streams once a watch has seen another outcome (see [`Refusals`]).
pub(super) const FORBIDDEN_CONFIRMATIONS: u32 = 3;

/// Decides when a 403 is believed. The first answer of a new watch is; after that, a refusal must
/// repeat [`FORBIDDEN_CONFIRMATIONS`] times in a row, because an API server that has just started
/// answers 403 until its RBAC caches are filled, and clients should not lose their stream to that.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    seen_outcome: bool,
    consecutive: u32,
}

impl Refusals {
    /// Records an answer that was not a refusal (the resource, its absence, or another
    /// failure): the next refusal starts a new run.
    pub fn not_refused(&mut self) {
        self.seen_outcome = true;
        self.consecutive = 0;
    }

    /// Records a refusal; true if clients are to be told.
    pub fn refused(&mut self) -> bool {
        if !self.seen_outcome {
            // Believed at once, and so is every refusal in a row after it.
            self.seen_outcome = true;
            self.consecutive = FORBIDDEN_CONFIRMATIONS;
            return true;
        }
        self.consecutive = self.consecutive.saturating_add(1);
        self.consecutive >= FORBIDDEN_CONFIRMATIONS
    }
}

/// The kinds of failure, as counted in `flagd_proxy_source_errors_total{source="kubernetes"}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// RBAC refuses the read.
    Forbidden,
    /// The API server does not accept the credentials (401).
    Unauthorized,
    /// The API server cannot be reached or answers 5xx/429.
    Unreachable,
    /// The API server does not serve the FeatureFlag resource (CRD not installed).
    NotServed,
    /// Anything else from the watch (unexpected status, undecodable answer).
    Watch,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Forbidden => "forbidden",
            Kind::Unauthorized => "unauthorized",
            Kind::Unreachable => "unreachable",
            Kind::NotServed => "not_served",
            Kind::Watch => "watch",
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(super) struct Problem {
    pub kind: Kind,
    pub message: String,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Nothing to report; the watcher recovers by itself (a 410 Gone inside the watch).
    Continue,
    /// Nothing to report; start over with a fresh list after the backoff.
    Restart,
    /// Report the problem, then start over with a fresh list after the backoff.
    Report(Problem),
}

/// Decides what a watcher error means, with a message that tells an operator what to do.
pub(super) fn classify(error: &watcher::Error, key: &ResourceKey, server: &str) -> Action {
    let (verb, source) = match error {
        watcher::Error::InitialListFailed(e) => ("list", e),
        watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => ("watch", e),
        watcher::Error::WatchError(status) if status.code == 410 => return Action::Continue,
        watcher::Error::WatchError(status) => {
            return Action::Report(classify_status(
                "watch",
                status.code,
                &status.reason,
                &status.message,
                key,
                server,
            ));
        }
        watcher::Error::NoResourceVersion => {
            return Action::Report(Problem {
                kind: Kind::Watch,
                message: format!(
                    "the Kubernetes API server at {server} answered without a resourceVersion; retrying"
                ),
            });
        }
    };
    match source {
        kube::Error::Api(status) if status.code == 410 => Action::Restart,
        kube::Error::Api(status) => Action::Report(classify_status(
            verb,
            status.code,
            &status.reason,
            &status.message,
            key,
            server,
        )),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            Action::Report(Problem {
                kind: Kind::Unreachable,
                message: format!(
                    "cannot reach the Kubernetes API server at {server}: {}; retrying",
                    error_chain(source)
                ),
            })
        }
        kube::Error::Auth(_) => Action::Report(Problem {
            kind: Kind::Unauthorized,
            message: format!(
                "cannot authenticate to the Kubernetes API server at {server}: {}; retrying",
                error_chain(source)
            ),
        }),
        other => Action::Report(Problem {
            kind: Kind::Watch,
            message: format!(
                "cannot {verb} {PLURAL}.{GROUP} in namespace {:?} at {server}: {}; retrying",
                key.namespace,
                error_chain(other)
            ),
        }),
    }
}

/// A failure status answered by the API server.
fn classify_status(
    verb: &str,
    code: u16,
    reason: &str,
    message: &str,
    key: &ResourceKey,
    server: &str,
) -> Problem {
    let said = if message.is_empty() {
        String::new()
    } else {
        format!(" (the API server said: {message})")
    };
    match code {
        403 => Problem {
            kind: Kind::Forbidden,
            message: format!(
                "RBAC forbids {verb} on {PLURAL}.{GROUP} in namespace {ns:?} for this proxy's identity: \
                 grant get, list, watch on {PLURAL}.{GROUP} in namespace {ns:?} (a RoleBinding) or in \
                 all namespaces (a ClusterRoleBinding){said}",
                ns = key.namespace,
            ),
        },
        401 => Problem {
            kind: Kind::Unauthorized,
            message: format!(
                "the Kubernetes API server at {server} does not accept this proxy's credentials \
                 (401 Unauthorized): check the token (--kube-token-path, KUBECONFIG or the \
                 service account){said}; retrying"
            ),
        },
        404 => Problem {
            kind: Kind::NotServed,
            message: format!(
                "the Kubernetes API server at {server} does not serve {PLURAL}.{GROUP}/{VERSION}: \
                 is the FeatureFlag CRD (OpenFeature Operator) installed?{said}; retrying"
            ),
        },
        429 | 500..=599 => Problem {
            kind: Kind::Unreachable,
            message: format!(
                "the Kubernetes API server at {server} is unavailable ({code} {reason}){said}; retrying"
            ),
        },
        _ => Problem {
            kind: Kind::Watch,
            message: format!(
                "cannot {verb} {PLURAL}.{GROUP} in namespace {ns:?} at {server}: {code} {reason}{said}; retrying",
                ns = key.namespace,
            ),
        },
    }
}

/// An error and its causes, without repeating text a message already includes.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn key() -> ResourceKey {
        ResourceKey::new("team-b", "flags")
    }

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Status::failure(message, reason).with_code(code).boxed())
    }

    fn problem(action: Action) -> Problem {
        match action {
            Action::Report(problem) => problem,
            other => panic!("expected a problem, got {other:?}"),
        }
    }

    #[test]
    fn forbidden_names_the_missing_permission() {
        let error = watcher::Error::InitialListFailed(api_error(
            403,
            "Forbidden",
            "featureflags.core.openfeature.dev is forbidden: User \"system:serviceaccount:flagd:proxy\" cannot list resource \"featureflags\"",
        ));
        let p = problem(classify(&error, &key(), "https://k8s:6443/"));
        assert_eq!(p.kind, Kind::Forbidden);
        assert!(
            p.message.starts_with(
                "RBAC forbids list on featureflags.core.openfeature.dev in namespace \"team-b\" for this proxy's identity: grant get, list, watch"
            ),
            "{}",
            p.message
        );
        assert!(p.message.contains("system:serviceaccount:flagd:proxy"));

        let error = watcher::Error::WatchStartFailed(api_error(403, "Forbidden", ""));
        let p = problem(classify(&error, &key(), "https://k8s:6443/"));
        assert!(
            p.message.starts_with("RBAC forbids watch on"),
            "{}",
            p.message
        );
    }

    #[test]
    fn other_statuses_are_classified() {
        let server = "https://k8s:6443/";
        let kind = |code| {
            problem(classify(
                &watcher::Error::InitialListFailed(api_error(code, "X", "m")),
                &key(),
                server,
            ))
            .kind
        };
        assert_eq!(kind(401), Kind::Unauthorized);
        assert_eq!(kind(404), Kind::NotServed);
        assert_eq!(kind(429), Kind::Unreachable);
        assert_eq!(kind(503), Kind::Unreachable);
        assert_eq!(kind(400), Kind::Watch);
        assert_eq!(Kind::NotServed.label(), "not_served");
        let gone = Status::failure("too old resource version", "Expired").with_code(410);
        assert_eq!(
            classify(
                &watcher::Error::WatchError(gone.clone().boxed()),
                &key(),
                server
            ),
            Action::Continue
        );
        assert_eq!(
            classify(
                &watcher::Error::WatchStartFailed(kube::Error::Api(gone.boxed())),
                &key(),
                server
            ),
            Action::Restart
        );
        let p = problem(classify(
            &watcher::Error::WatchError(
                Status::failure("denied", "Forbidden")
                    .with_code(403)
                    .boxed(),
            ),
            &key(),
            server,
        ));
        assert_eq!(p.kind, Kind::Forbidden);
    }

    #[test]
    fn connection_failures_are_unreachable() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let error = watcher::Error::InitialListFailed(kube::Error::Service(Box::new(io)));
        let p = problem(classify(&error, &key(), "https://127.0.0.1:1/"));
        assert_eq!(p.kind, Kind::Unreachable);
        assert!(
            p.message
                .starts_with("cannot reach the Kubernetes API server at https://127.0.0.1:1/")
                && p.message.contains("connection refused"),
            "{}",
            p.message
        );
    }

    #[test]
    fn refusals_are_believed_at_once_only_on_a_new_watch() {
        let mut fresh = Refusals::default();
        assert!(fresh.refused(), "the first answer of a new watch");
        assert!(fresh.refused());

        let mut worked = Refusals::default();
        worked.not_refused();
        assert!(!worked.refused());
        assert!(!worked.refused());
        assert!(worked.refused(), "the third refusal in a row");
        worked.not_refused();
        assert!(
            !worked.refused(),
            "counting starts over after access worked"
        );

        let mut unreachable = Refusals::default();
        unreachable.not_refused();
        assert!(!unreachable.refused());
        unreachable.not_refused();
        assert!(!unreachable.refused());
        assert!(!unreachable.refused());
        assert!(unreachable.refused());
    }
}
