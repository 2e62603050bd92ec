//! The proxy the way users run it: as a container image in pods of a real single-node cluster
//! (`testkit/src/cluster.rs`, run by the test kit's `flagd-proxy-cluster`), deployed by `deploy/`
//! or by the real OpenFeature Operator, reading FeatureFlags with its in-cluster service-account
//! token, probed by the kubelet and reached by flagd through its Service name.
//!
//! One cluster serves every test of this binary (`deploy`, `operator`, `helm`, `authz`, `image`,
//! `rollouts`; what they deploy is in `workloads`); each test works in its own namespaces, and a
//! test that disrupts the cluster itself (an API-server restart) has it alone
//! (`exclusive_cluster_or_skip`): the others wait for it or it for them. Without the cluster's
//! dependencies (root, Debian packages, the Go binaries) the tests are skipped and listed by
//! `scripts/test` (a failure when `CI` is set).
use flagd_proxy_testkit as support;

mod authz;
mod deploy;
mod helm;
mod image;
mod operator;
mod rollouts;
mod steps;
mod workloads;

use workloads::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use serde_json::{Value, json};
use support::TestCa;
use support::cluster::{
    CLUSTER_TIMEOUT, Cluster, NETNS, build_proxy_image, cluster_or_skip, exclusive_cluster_or_skip,
    operator_binary, wait_for,
};
use support::control_plane::test_data;

/// A FeatureFlag `ns/name` with one string flag `color` whose default variant is `default`.
fn feature_flag(ns: &str, name: &str, default: &str) -> String {
    colors_flag(ns, name, &["red", "blue"], default)
}

/// A FeatureFlag `ns/name` with one string flag `color`, a variant for each of `colors` (its
/// value the name), whose default variant is `default`.
fn colors_flag(ns: &str, name: &str, colors: &[&str], default: &str) -> String {
    let variants: serde_json::Map<String, Value> =
        colors.iter().map(|c| (c.to_string(), json!(c))).collect();
    json!({
        "apiVersion": "core.openfeature.dev/v1beta1",
        "kind": "FeatureFlag",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"flagSpec": {"flags": {"color": {
            "state": "ENABLED",
            "variants": variants,
            "defaultVariant": default
        }}}}
    })
    .to_string()
}

/// Evaluates the string flag `color` through flagd's evaluation API at `ip:8013`.
fn evaluate_color(cluster: &Cluster, ip: &str) -> Result<String, String> {
    let body = cluster.http_post_json(
        &format!("http://{ip}:8013/flagd.evaluation.v1.Service/ResolveString"),
        r#"{"flagKey":"color","context":{}}"#,
    )?;
    let answer: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    answer["value"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no value in {body}"))
}

/// Waits until flagd at `ip` evaluates `color` to `want`.
fn wait_for_color(cluster: &Cluster, ip: &str, want: &str) {
    wait_for(
        &format!("flagd at {ip} to evaluate color={want}"),
        CLUSTER_TIMEOUT,
        || {
            let got = evaluate_color(cluster, ip)?;
            if got == want {
                Ok(())
            } else {
                Err(format!("color={got}"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Changes the default variant of `color` in the FeatureFlag `ns/name`.
fn set_default_color(cluster: &Cluster, ns: &str, name: &str, default: &str) {
    let patch = json!({"spec": {"flagSpec": {"flags": {"color": {"defaultVariant": default}}}}});
    cluster
        .kubectl(&[
            "-n",
            ns,
            "patch",
            "featureflag",
            name,
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ])
        .unwrap_or_else(|e| panic!("patch FeatureFlag: {e}"));
}

/// The one Running pod's IP for `selector` in `ns`.
fn single_pod_ip(cluster: &Cluster, ns: &str, selector: &str) -> String {
    wait_for(
        &format!("a Running pod {selector} in {ns}"),
        CLUSTER_TIMEOUT,
        || match cluster.pod_ips(ns, selector)?.as_slice() {
            [ip] => Ok(ip.clone()),
            other => Err(format!("pod IPs {other:?}")),
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// What one evaluation through a flagd pod gave.
enum Evaluation {
    Value(String),
    /// flagd answered with an error (no flag, no configuration): a real failure.
    Refused(String),
    /// No answer at all (the request timed out on a busy machine): says nothing about flagd.
    NoAnswer(String),
}

fn evaluate_once(cluster: &Cluster, ip: &str) -> Evaluation {
    let url = format!("http://{ip}:8013/flagd.evaluation.v1.Service/ResolveString");
    let result = cluster.exec(&[
        "curl",
        "-sS",
        "--max-time",
        "10",
        "-H",
        "Content-Type: application/json",
        "--data",
        r#"{"flagKey":"color","context":{}}"#,
        &url,
    ]);
    match result {
        Err(error) => Evaluation::NoAnswer(error),
        Ok(body) => match serde_json::from_str::<Value>(&body) {
            Ok(answer) => match answer["value"].as_str() {
                Some(value) => Evaluation::Value(value.to_owned()),
                None => Evaluation::Refused(body),
            },
            Err(_) => Evaluation::Refused(body),
        },
    }
}

/// Waits until every flagd in `ips` evaluates `color` to `want`.
fn wait_for_all(cluster: &Cluster, ips: &[String], want: &str) {
    for ip in ips {
        wait_for_color(cluster, ip, want);
    }
}
