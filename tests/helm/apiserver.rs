//! Against a real API server: applying rendered objects with strict field validation, pod
//! templates admitted (dry run) under the restricted Pod Security Standard, RBAC.

use super::*;

/// The API for one rendered object, found by discovery.
pub(crate) async fn api_for(cp: &ControlPlane, object: &Value, ns: &str) -> Api<DynamicObject> {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind(object));
    let client = cp.admin_client();
    let (resource, capabilities) = discovery::pinned_kind(&client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("discovering {api_version} {}: {e}", kind(object)));
    match capabilities.scope {
        Scope::Namespaced => Api::namespaced_with(client, ns, &resource),
        Scope::Cluster => Api::all_with(client, &resource),
    }
}

/// Creates namespace `ns`, enforcing the "restricted" Pod Security Standard.
pub(crate) async fn restricted_namespace(cp: &ControlPlane, ns: &str) {
    let namespace = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": ns, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }},
    });
    let api = api_for(cp, &namespace, ns).await;
    let object: DynamicObject = serde_json::from_value(namespace).expect("Namespace");
    api.patch(
        ns,
        &PatchParams::apply(FIELD_MANAGER).validation_strict(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
}

/// A bare Pod with a workload's pod template, to get the Pod Security admission verdict.
pub(crate) fn pod_from_template(workload: &Value, pod_name: &str, ns: &str) -> DynamicObject {
    let template = &workload["spec"]["template"];
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": ns, "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }))
    .expect("a Pod")
}

pub(crate) async fn dry_run_pod(
    cp: &ControlPlane,
    ns: &str,
    pod: &DynamicObject,
) -> Result<(), kube::Error> {
    let api = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(cp.admin_client(), ns);
    let pod: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(serde_json::to_value(pod).expect("json")).expect("a typed Pod");
    api.create(
        &PostParams {
            dry_run: true,
            ..PostParams::default()
        },
        &pod,
    )
    .await
    .map(|_| ())
}

pub(crate) async fn apply_case(cp: &ControlPlane, case: &Case, objects: &[Value]) {
    let ns = case.ns();
    let what = case.name;
    restricted_namespace(cp, &ns).await;

    for object in objects {
        if CRD_KINDS.contains(&kind(object)) {
            continue;
        }
        let api = api_for(cp, object, &ns).await;
        let typed: DynamicObject = serde_json::from_value(object.clone()).expect("object");
        let object_name = name(object).to_owned();
        let params = PatchParams::apply(FIELD_MANAGER).validation_strict();
        if let Err(error) = api
            .patch(&object_name, &params, &Patch::Apply(&typed))
            .await
        {
            panic!(
                "{what}: the apiserver refused {} {object_name}: {error}",
                kind(object)
            );
        }
        // Read back: the apiserver kept what the chart asked for.
        let stored = api
            .get(&object_name)
            .await
            .unwrap_or_else(|e| panic!("{what}: reading back {} {object_name}: {e}", kind(object)));
        if let Some(want) = object.get("spec") {
            let got = stored.data.get("spec").expect("stored spec");
            assert_subset(
                &format!("{what}: {} {object_name} spec", kind(object)),
                want,
                got,
            );
        }
    }

    // The real Pod Security verdict on each pod template.
    for workload in objects
        .iter()
        .filter(|o| matches!(kind(o), "Deployment" | "DaemonSet"))
    {
        let pod = pod_from_template(workload, &format!("{}-pss", name(workload)), &ns);
        if let Err(error) = dry_run_pod(cp, &ns, &pod).await {
            panic!(
                "{what}: the {} {} pod template is refused in a restricted namespace: {error}",
                kind(workload),
                name(workload)
            );
        }
    }

    // RBAC as the apiserver sees it.
    if case.central() {
        let sa = format!("system:serviceaccount:{ns}:flagd-proxy");
        let group = "core.openfeature.dev";
        for verb in ["get", "list", "watch"] {
            for resource in ["featureflags", "featureflagsources"] {
                eventually(&format!("{what}: {sa} may {verb} {resource}"), || async {
                    if cp
                        .service_account_may(&ns, "flagd-proxy", verb, group, resource, "some-app")
                        .await
                    {
                        Ok(())
                    } else {
                        Err("not yet allowed".to_owned())
                    }
                })
                .await;
            }
        }
        let events = case.value("central.events.enabled") != Some("false");
        for verb in ["create", "patch"] {
            assert_eq!(
                cp.service_account_may(
                    &ns,
                    "flagd-proxy",
                    verb,
                    "events.k8s.io",
                    "events",
                    "some-app"
                )
                .await,
                events,
                "{what}: {sa} may {verb} events"
            );
        }
        for (verb, group, resource) in [
            ("update", group, "featureflags"),
            ("delete", group, "featureflags"),
            ("get", "events.k8s.io", "events"),
            ("list", "events.k8s.io", "events"),
            ("delete", "events.k8s.io", "events"),
            ("create", "", "events"),
            ("get", "", "secrets"),
            ("list", "", "configmaps"),
            ("list", "", "pods"),
            ("watch", "", "pods"),
        ] {
            assert!(
                !cp.service_account_may(&ns, "flagd-proxy", verb, group, resource, "some-app")
                    .await,
                "{what}: {sa} may {verb} {resource}"
            );
        }
    }
    if case.node() {
        for resource in ["featureflags", "featureflagsources"] {
            assert!(
                !cp.service_account_may(
                    &ns,
                    "flagd-proxy-node",
                    "get",
                    "core.openfeature.dev",
                    resource,
                    "some-app"
                )
                .await,
                "{what}: the node tier may read {resource}"
            );
        }
    }
}

/// Every field of `want` is in `got` with the same value (the apiserver adds defaults).
pub(crate) fn assert_subset(what: &str, want: &Value, got: &Value) {
    match (want, got) {
        (Value::Object(want), Value::Object(got)) => {
            for (key, value) in want {
                let Some(stored) = got.get(key) else {
                    panic!("{what}: field {key} was dropped");
                };
                assert_subset(&format!("{what}.{key}"), value, stored);
            }
        }
        (Value::Array(want), Value::Array(got)) => {
            assert_eq!(want.len(), got.len(), "{what}: list length");
            for (i, (w, g)) in want.iter().zip(got).enumerate() {
                assert_subset(&format!("{what}[{i}]"), w, g);
            }
        }
        // Quantities and int-or-strings may come back normalised; compare as text.
        (Value::String(w), Value::Number(g)) | (Value::Number(g), Value::String(w)) => {
            assert_eq!(w, &g.to_string(), "{what}");
        }
        _ => assert_eq!(want, got, "{what}"),
    }
}
