//! Every way a client's request can be refused (its selector, its authorization, the resource's
//! state), and the one mapping from those errors to gRPC status. Statuses of the transport are
//! made where the transport fails: a deadline (`net/deadlines.rs`), an unreadable request body
//! (`wire/body.rs`), an unknown method (`wire/routes.rs`), a limit on the connection
//! (`server.rs`).
use tonic::{Code, Status};

use crate::authz::AuthzError;
use crate::hub::HubError;
use crate::selector::{ResourceKey, SelectorError};

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Selector(#[from] SelectorError),
    #[error(transparent)]
    Hub(#[from] HubError),
    #[error(transparent)]
    Authz(#[from] AuthzError),
    #[error("{0} does not exist")]
    NotFound(ResourceKey),
    #[error(
        "{key} does not exist, and the proxy already waits for {limit} resources that do not exist (the limit set by --max-waiting-resources)"
    )]
    TooManyWaiting { key: ResourceKey, limit: usize },
    #[error(
        "{key} is refused: this client already names {limit} other resources in its open streams and calls (the limit set by --max-resources-per-address)"
    )]
    TooManyResourcesForClient { key: ResourceKey, limit: usize },
    #[error("the proxy may not read {key}: {reason}")]
    Forbidden { key: ResourceKey, reason: String },
    #[error(
        "{key} is invalid and has no earlier valid version to serve: {reason} (fix the resource; it is served as soon as it is valid)"
    )]
    Invalid { key: ResourceKey, reason: String },
    #[error("the source of {key} is unreachable: {reason}")]
    Unreachable { key: ResourceKey, reason: String },
    #[error("the source has not answered for {0} yet; try again")]
    SourceTimeout(ResourceKey),
    #[error("the proxy is shutting down; reconnect")]
    ShuttingDown,
}

impl RequestError {
    fn code(&self) -> Code {
        match self {
            RequestError::Selector(_) => Code::InvalidArgument,
            RequestError::Hub(HubError::TooManyWatches { .. } | HubError::MemoryBudget)
            | RequestError::TooManyWaiting { .. }
            | RequestError::TooManyResourcesForClient { .. } => Code::ResourceExhausted,
            RequestError::NotFound(_) => Code::NotFound,
            RequestError::Authz(AuthzError::Unauthenticated(_)) => Code::Unauthenticated,
            RequestError::Authz(AuthzError::Denied { .. }) => Code::PermissionDenied,
            RequestError::Authz(AuthzError::Unavailable(_)) => Code::Unavailable,
            RequestError::Forbidden { .. } => Code::PermissionDenied,
            RequestError::Invalid { .. } => Code::FailedPrecondition,
            RequestError::Unreachable { .. }
            | RequestError::SourceTimeout(_)
            | RequestError::ShuttingDown => Code::Unavailable,
        }
    }
}

impl From<RequestError> for Status {
    fn from(error: RequestError) -> Self {
        Status::new(error.code(), error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_carry_the_message() {
        let status = Status::from(RequestError::Selector(SelectorError::Missing));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status
                .message()
                .contains("core.openfeature.dev/<namespace>/<name>")
        );
        let status = Status::from(RequestError::NotFound(ResourceKey::new("a", "b")));
        assert_eq!(
            (status.code(), status.message()),
            (Code::NotFound, "core.openfeature.dev/a/b does not exist")
        );
        assert_eq!(
            Status::from(RequestError::ShuttingDown).code(),
            Code::Unavailable
        );
        // The limits: the resource, the limit and the flag that sets it.
        let key = ResourceKey::new("a", "b");
        for (error, limit, flag) in [
            (
                RequestError::TooManyWaiting {
                    key: key.clone(),
                    limit: 7,
                },
                " 7 ",
                "--max-waiting-resources",
            ),
            (
                RequestError::TooManyResourcesForClient {
                    key: key.clone(),
                    limit: 100,
                },
                " 100 ",
                "--max-resources-per-address",
            ),
        ] {
            let status = Status::from(error);
            assert_eq!(status.code(), Code::ResourceExhausted);
            assert!(
                status.message().contains("core.openfeature.dev/a/b")
                    && status.message().contains(limit)
                    && status.message().contains(flag),
                "{status:?}"
            );
        }
        let status = Status::from(RequestError::Invalid {
            key: ResourceKey::new("a", "b"),
            reason: "flag \"f\": state is required".into(),
        });
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(
            status.message().starts_with(
                "core.openfeature.dev/a/b is invalid and has no earlier valid version"
            ) && status.message().contains("flag \"f\": state is required"),
            "{status:?}"
        );
    }
}
