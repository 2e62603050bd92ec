//! The Kubernetes source against a real kube-apiserver and etcd (see `testkit/src/control_plane.rs`),
//! with the proxy binary running as the restricted identity `system:serviceaccount:flagd:proxy`.
//!
//! Each test starts its own control plane and uses its own namespaces. The tests that need one
//! take turns (a lock), so a small machine never runs several API servers at once. Without the
//! control-plane binaries these tests are skipped and listed by `scripts/test` (a failure when
//! `CI` is set). By concern: `configuration`, `watches`, `deploy`, `events`, `faults`.
use flagd_proxy_testkit as support;

mod configuration;
mod deploy;
mod events;
mod faults;
mod watches;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::discovery::Scope;
use serde::Deserialize;
use serde_json::{Value, json};
use support::client::{
    Client, assert_status, client, default_variant, fetch, next_message, open, v1, with_selector,
};
use support::control_plane::{self, ControlPlane, feature_flag_resource};
use support::relay::Relay;
use support::{EVENT_TIMEOUT, Proxy, eventually, string_flag};
use tonic::{Code, Status, Streaming};

/// One control plane at a time.
static CONTROL_PLANE_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The forbidden-error counter of the Kubernetes source.
const FORBIDDEN_METRIC: &str =
    "flagd_proxy_source_errors_total{source=\"kubernetes\",kind=\"forbidden\"}";

// ---------------------------------------------------------------------------------------------
// Helpers

/// This test's turn at the control plane, and a new control plane; `None` without its binaries
/// (the test is skipped). The turn is held until it is dropped, at the end of the test.
async fn control_plane_or_skip() -> Option<(tokio::sync::MutexGuard<'static, ()>, ControlPlane)> {
    let turn = CONTROL_PLANE_TURN.lock().await;
    let cp = control_plane::start_or_skip().await?;
    Some((turn, cp))
}

/// Lets the proxy read cluster-wide and creates the namespace `ns` with the FeatureFlag
/// `<ns>/<name>` (`color` red).
async fn granted_red_flag(cp: &ControlPlane, ns: &str, name: &str) {
    cp.grant_proxy_cluster_wide().await;
    cp.create_namespace(ns).await;
    create_flag(cp, ns, name, "red").await;
}

/// A FeatureFlag `<ns>/<name>` with one string flag `color` defaulting to `variant`.
fn feature_flag(ns: &str, name: &str, variant: &str) -> DynamicObject {
    control_plane::feature_flag_object(ns, name, string_flag("color", variant, &[variant, "other"]))
}

fn flags_api(cp: &ControlPlane, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(cp.admin_client(), ns, &feature_flag_resource())
}

async fn create_flag(cp: &ControlPlane, ns: &str, name: &str, variant: &str) {
    let api = flags_api(cp, ns);
    let object = feature_flag(ns, name, variant);
    let params = PostParams::default();
    eventually(&format!("creating FeatureFlag {ns}/{name}"), || {
        api.create(&params, &object)
    })
    .await;
}

async fn set_variant(cp: &ControlPlane, ns: &str, name: &str, variant: &str) {
    let patch = json!({"spec": {"flagSpec": {"flags": {"color": {
        "variants": {variant: variant},
        "defaultVariant": variant
    }}}}});
    patch_flag(cp, ns, name, "updating", &patch).await;
}

/// Merges `patch` into the FeatureFlag `<ns>/<name>`; `doing` says what for, in a failure.
async fn patch_flag(cp: &ControlPlane, ns: &str, name: &str, doing: &str, patch: &Value) {
    let api = flags_api(cp, ns);
    let params = PatchParams::default();
    let patch = Patch::Merge(patch);
    eventually(&format!("{doing} FeatureFlag {ns}/{name}"), || {
        api.patch(name, &params, &patch)
    })
    .await;
}

async fn delete_flag(cp: &ControlPlane, ns: &str, name: &str) {
    let api = flags_api(cp, ns);
    let params = DeleteParams::default();
    eventually(&format!("deleting FeatureFlag {ns}/{name}"), || {
        api.delete(name, &params)
    })
    .await;
}

fn selector(ns: &str, name: &str) -> String {
    format!("core.openfeature.dev/{ns}/{name}")
}

/// The first message of a new stream, or the status that refused or ended it.
async fn first_message(
    client: &mut Client,
    selector: &str,
) -> Result<v1::SyncFlagsResponse, Status> {
    let mut stream = open(client, selector).await?;
    next_message(&mut stream).await
}

async fn next_variant(stream: &mut Streaming<v1::SyncFlagsResponse>) -> String {
    let message = next_message(stream)
        .await
        .expect("the stream stays healthy");
    default_variant(&message.flag_configuration, "color")
}

/// Reads a stream until it carries `want`; intermediate versions may come first.
async fn wait_for_variant(stream: &mut Streaming<v1::SyncFlagsResponse>, want: &str) {
    loop {
        if next_variant(stream).await == want {
            return;
        }
    }
}

/// Waits until one log line contains every needle.
async fn wait_for_log_line(proxy: &Proxy, needles: &[&str]) -> String {
    wait_for_log_line_within(proxy, needles, EVENT_TIMEOUT).await
}

/// Waits until one log line contains every needle, for at most `timeout` (a hang guard).
async fn wait_for_log_line_within(proxy: &Proxy, needles: &[&str], timeout: Duration) -> String {
    support::eventually_within("a log line with all the needles", timeout, || async {
        let log = proxy.log_text();
        match log.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
            Some(line) => Ok(line.to_owned()),
            None => Err(format!("no log line with all of {needles:?}:\n{log}")),
        }
    })
    .await
}

/// [`granted_red_flag`], then the proxy with `extra` flags.
async fn proxy_with_red_flag(cp: &ControlPlane, ns: &str, name: &str, extra: &[&str]) -> Proxy {
    granted_red_flag(cp, ns, name).await;
    start_proxy_with_flags(cp, extra).await
}

async fn start_proxy_with_flags(cp: &ControlPlane, extra: &[&str]) -> Proxy {
    start_proxy_with_env(cp, extra, &[]).await
}

/// The proxy against the control plane with `extra` flags and the environment variables `env`.
async fn start_proxy_with_env(cp: &ControlPlane, extra: &[&str], env: &[(&str, &str)]) -> Proxy {
    let args = cp.proxy_args(extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Proxy::start_with_env(&args, env).await
}

/// A client of `proxy` and its stream of `target`, which has delivered `color` red.
async fn red_stream(proxy: &Proxy, target: &str) -> (Client, Streaming<v1::SyncFlagsResponse>) {
    let mut client = client(proxy).await;
    let mut stream = open(&mut client, target).await.expect("stream opened");
    assert_eq!(next_variant(&mut stream).await, "red");
    (client, stream)
}
