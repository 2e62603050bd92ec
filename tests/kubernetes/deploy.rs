//! `deploy/` applied to the control plane, and invented selectors that must not grow the watches.

use super::*;
use flagd_proxy_testkit::or_return;

#[derive(Deserialize)]
struct Kustomization {
    namespace: Option<String>,
    resources: Vec<String>,
    #[serde(default)]
    images: Vec<ImageOverride>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageOverride {
    name: String,
    new_name: Option<String>,
    new_tag: Option<String>,
}

/// The objects `kubectl apply -k deploy/` would create: the listed files with the kustomization's
/// namespace and image settings applied (the parts of kustomize these files use).
fn rendered_deploy_objects(dir: &Path) -> (String, Vec<Value>) {
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).expect("kustomization.yaml");
    let kustomization: Kustomization = serde_norway::from_str(&text).expect("kustomization parses");
    let namespace = kustomization
        .namespace
        .clone()
        .expect("the base kustomization sets a namespace");
    let mut objects = Vec::new();
    for file in &kustomization.resources {
        let path: PathBuf = dir.join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        for document in serde_norway::Deserializer::from_str(&text) {
            let value = Value::deserialize(document)
                .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
            if !value.is_null() {
                objects.push(value);
            }
        }
    }
    let service_accounts: Vec<String> = objects
        .iter()
        .filter(|o| o["kind"] == "ServiceAccount")
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    for object in &mut objects {
        if let Some(subjects) = object.get_mut("subjects").and_then(Value::as_array_mut) {
            for subject in subjects {
                let names_ours = subject["kind"] == "ServiceAccount"
                    && subject["name"]
                        .as_str()
                        .is_some_and(|n| service_accounts.iter().any(|s| s == n));
                if names_ours {
                    subject["namespace"] = json!(namespace);
                }
            }
        }
        if let Some(containers) = object
            .pointer_mut("/spec/template/spec/containers")
            .and_then(Value::as_array_mut)
        {
            for container in containers {
                let image = container["image"].as_str().unwrap_or_default().to_owned();
                let (name, tag) = image.rsplit_once(':').unwrap_or((&image, ""));
                if let Some(o) = kustomization.images.iter().find(|o| o.name == name) {
                    let name = o.new_name.as_deref().unwrap_or(name);
                    let tag = o.new_tag.as_deref().unwrap_or(tag);
                    container["image"] = json!(format!("{name}:{tag}"));
                }
            }
        }
    }
    (namespace, objects)
}

/// Creates one object as the administrator with strict field validation (unknown or duplicate
/// fields are errors, not warnings).
async fn create_strictly(cp: &ControlPlane, namespace: &str, object: &mut Value) -> String {
    let api_version = object["apiVersion"]
        .as_str()
        .expect("apiVersion")
        .to_owned();
    let kind = object["kind"].as_str().expect("kind").to_owned();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
    let client = cp.admin_client();
    let (resource, capabilities) =
        kube::discovery::pinned_kind(&client, &GroupVersionKind::gvk(group, version, &kind))
            .await
            .unwrap_or_else(|e| panic!("the API server does not know {api_version} {kind}: {e}"));
    let ns = match capabilities.scope {
        Scope::Namespaced => {
            object["metadata"]["namespace"] = json!(namespace);
            Some(namespace)
        }
        Scope::Cluster => None,
    };
    let base = if resource.group.is_empty() {
        format!("/api/{}", resource.version)
    } else {
        format!("/apis/{}/{}", resource.group, resource.version)
    };
    let url = match ns {
        Some(ns) => format!("{base}/namespaces/{ns}/{}", resource.plural),
        None => format!("{base}/{}", resource.plural),
    };
    let request = http::Request::post(format!("{url}?fieldValidation=Strict"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(object).expect("json"))
        .expect("request");
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or("?")
        .to_owned();
    client
        .request::<Value>(request)
        .await
        .unwrap_or_else(|e| panic!("the API server refused {kind} {name}: {e}"));
    format!("{kind}/{name}")
}

/// The deploy/ manifests are accepted by a real API server and give the proxy's service account
/// read access to the OpenFeature resources, create and patch on Events, and nothing else.
#[tokio::test]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn deploy_manifests_are_accepted_and_grant_read_only_access() {
    let (_turn, cp) = or_return!(control_plane_or_skip().await);
    // The control plane pre-creates a ClusterRole of the same name for its own tests; the one
    // from deploy/ replaces it.
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(cp.admin_client())
        .delete(control_plane::PROXY_CLUSTER_ROLE, &DeleteParams::default())
        .await
        .expect("deleting the control plane's own ClusterRole");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let (namespace, mut objects) = rendered_deploy_objects(&dir);
    assert_eq!(namespace, "flagd-proxy");
    // Namespaces first, as kubectl orders them.
    objects.sort_by_key(|o| o["kind"] != "Namespace");
    let mut created = Vec::new();
    for object in &mut objects {
        created.push(create_strictly(&cp, &namespace, object).await);
    }
    for want in [
        "Namespace/flagd-proxy",
        "ServiceAccount/flagd-proxy",
        "ClusterRole/flagd-proxy",
        "ClusterRoleBinding/flagd-proxy",
        "Deployment/flagd-proxy",
        "Service/flagd-proxy-svc",
    ] {
        assert!(
            created.iter().any(|c| c == want),
            "{want} not in {created:?}"
        );
    }
    let service: Value = cp
        .admin_client()
        .request(
            http::Request::get(format!(
                "/api/v1/namespaces/{namespace}/services/flagd-proxy-svc"
            ))
            .body(Vec::new())
            .expect("request"),
        )
        .await
        .expect("the Service exists");
    assert_eq!(service["spec"]["ports"][0]["port"], 8015);

    // Wait until RBAC has seen the binding, then ask about everything else.
    let may = |verb, group, resource, ns| {
        cp.service_account_may(&namespace, "flagd-proxy", verb, group, resource, ns)
    };
    let group = control_plane::GROUP;
    support::eventually("the ClusterRoleBinding takes effect", || async {
        if may("watch", group, "featureflags", "some-app").await {
            Ok(())
        } else {
            Err("not yet")
        }
    })
    .await;
    let mut answers = BTreeMap::new();
    for resource in ["featureflags", "featureflagsources"] {
        for verb in ["get", "list", "watch"] {
            for ns in ["some-app", &namespace, ""] {
                answers.insert(
                    format!("{verb} {resource} in {ns:?}"),
                    (may(verb, group, resource, ns).await, true),
                );
            }
        }
        for verb in ["create", "update", "patch", "delete"] {
            answers.insert(
                format!("{verb} {resource} in \"some-app\""),
                (may(verb, group, resource, "some-app").await, false),
            );
        }
    }
    // Events on FeatureFlags: create and patch, in any namespace, nothing more.
    for verb in ["create", "patch"] {
        answers.insert(
            format!("{verb} events.k8s.io/events in \"some-app\""),
            (may(verb, "events.k8s.io", "events", "some-app").await, true),
        );
    }
    for (verb, group, resource, ns) in [
        ("get", "events.k8s.io", "events", "some-app"),
        ("list", "events.k8s.io", "events", ""),
        ("update", "events.k8s.io", "events", "some-app"),
        ("delete", "events.k8s.io", "events", "some-app"),
        ("create", "", "events", "some-app"),
        ("get", "", "secrets", namespace.as_str()),
        ("list", "", "secrets", ""),
        ("list", "", "pods", ""),
        ("watch", "", "pods", ""),
        ("get", "", "configmaps", "some-app"),
        ("list", "apps", "deployments", namespace.as_str()),
    ] {
        answers.insert(
            format!("{verb} {group}/{resource} in {ns:?}"),
            (may(verb, group, resource, ns).await, false),
        );
    }
    let wrong: Vec<_> = answers
        .iter()
        .filter(|(_, (allowed, want))| allowed != want)
        .map(|(what, (allowed, _))| format!("{what}: allowed={allowed}"))
        .collect();
    assert!(wrong.is_empty(), "unexpected RBAC answers: {wrong:#?}");
}

#[tokio::test]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn invented_selectors_keep_api_server_watches_bounded() {
    let (_turn, cp) = or_return!(control_plane_or_skip().await);
    let proxy = proxy_with_red_flag(
        &cp,
        "flood",
        "real",
        &[
            "--idle-timeout",
            "1s",
            "--max-watches",
            "50",
            "--max-waiting-resources",
            "10",
        ],
    )
    .await;
    let mut good_client = client(&proxy).await;
    let mut good = open(&mut good_client, &selector("flood", "real"))
        .await
        .expect("stream");
    assert_eq!(next_variant(&mut good).await, "red");

    // 300 invented names over three connections, all open at once.
    let mut flood_clients = [
        client(&proxy).await,
        client(&proxy).await,
        client(&proxy).await,
    ];
    let mut flood = Vec::new();
    let mut refused = 0;
    let mut most_watches = 0;
    for i in 0..300 {
        match open(
            &mut flood_clients[i % 3],
            &selector("flood", &format!("invented-{i}")),
        )
        .await
        {
            Ok(stream) => flood.push(stream),
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                refused += 1;
            }
        }
        if i % 25 == 0 {
            most_watches = most_watches.max(cp.open_watches("featureflags").await);
        }
    }
    // Every invented name ends up refused (over --max-watches at once, or over
    // --max-waiting-resources once the API server says it does not exist) or waiting: the
    // proxy's counts say when all 300 are settled, and how many accepted streams it ended.
    let count =
        |reason: &str| format!("flagd_proxy_rejected_requests_total{{reason=\"{reason}\"}}");
    let ended = eventually("the proxy settles all 300 invented names", || async {
        let over_watches = proxy.metric(&count("max_watches")).await;
        let over_waiting = proxy.metric(&count("max_waiting_resources")).await;
        let waiting = proxy.metric("flagd_proxy_waiting_resources").await;
        match over_watches + over_waiting + waiting {
            300.0 => Ok(over_waiting as usize),
            settled => Err(format!("{settled} of 300 settled")),
        }
    })
    .await;
    // Exactly that many accepted streams end, each with RESOURCE_EXHAUSTED; the rest wait.
    let mut waiting: futures::stream::FuturesUnordered<_> = flood
        .into_iter()
        .map(|mut stream| async move { (stream.message().await, stream) })
        .collect();
    for _ in 0..ended {
        let next = tokio::time::timeout(EVENT_TIMEOUT, futures::StreamExt::next(&mut waiting))
            .await
            .expect("a refused stream ends");
        match next {
            Some((Err(status), _)) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                refused += 1;
            }
            other => panic!("an invented resource delivered {:?}", other.map(|(m, _)| m)),
        }
    }
    most_watches = most_watches.max(cp.open_watches("featureflags").await);
    assert!(
        most_watches <= 50,
        "the API server saw {most_watches} watches; --max-watches is 50"
    );
    assert!(
        waiting.len() <= 10,
        "{} streams still wait; --max-waiting-resources is 10",
        waiting.len()
    );
    assert!(refused >= 290 - waiting.len(), "refused {refused}");

    // The real subscriber is unaffected.
    set_variant(&cp, "flood", "real", "blue").await;
    wait_for_variant(&mut good, "blue").await;

    // Once the flood is gone, only the real resource is watched.
    drop(waiting);
    drop(flood_clients);
    cp.wait_for_open_watches("featureflags", 1).await;
}
