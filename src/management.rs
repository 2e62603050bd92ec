//! Management: liveness, readiness, Prometheus metrics, a status page, and gRPC health, on one
//! port (HTTP/1.1 and HTTP/2 both).
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::hub::{Availability, Hub};
use crate::source::Source;

/// Whether the proxy is serving: true once listening, false from the moment shutdown begins.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct AppState {
    hub: Hub,
    source: Arc<dyn Source>,
    readiness: Readiness,
}

/// The management routes; `grpc` adds gRPC services (health) to the same port.
pub fn router(
    hub: Hub,
    source: Arc<dyn Source>,
    readiness: Readiness,
    grpc: tonic::service::Routes,
) -> Router {
    let http = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(AppState {
            hub,
            source,
            readiness,
        });
    grpc.into_axum_router().merge(http)
}

/// Serves the management routes until `shutdown` is cancelled.
pub async fn run(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.readiness.get() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.hub.metrics().encode(),
    )
}

/// Every watched resource with its state, and the source's own problems.
async fn status(State(state): State<AppState>) -> Json<Value> {
    let resources: Vec<Value> = state
        .hub
        .resources()
        .into_iter()
        .map(|(key, resource, subscribers)| {
            let (availability, reason) = match &resource.availability {
                Availability::Pending => ("pending", None),
                Availability::Present => ("present", None),
                Availability::Absent => ("absent", None),
                Availability::Invalid(r) => ("invalid", Some(r.to_string())),
                Availability::Forbidden(r) => ("forbidden", Some(r.to_string())),
                Availability::Unreachable(r) => ("unreachable", Some(r.to_string())),
                Availability::TooManyWaiting { limit } => (
                    "refused",
                    Some(format!(
                        "does not exist, and {limit} resources that do not exist are already waited on"
                    )),
                ),
            };
            json!({
                "selector": key.to_string(),
                "availability": availability,
                "reason": reason,
                "version": resource.snapshot.as_ref().map(|s| s.version),
                "bytes": resource.snapshot.as_ref().map(|s| s.flag_configuration.len()),
                "subscribers": subscribers,
            })
        })
        .collect();
    Json(json!({
        "ready": state.readiness.get(),
        "source": state.source.name(),
        "sourceStatus": state.source.status(),
        "resources": resources,
    }))
}
