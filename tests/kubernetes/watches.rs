//! Watches against the control plane: one per resource, refusals, restarts, many resources.

use super::*;
use flagd_proxy_testkit::or_return;

/// Many subscribers share one watch, which closes once they have gone; creations, updates,
/// deletions and re-creations reach open streams. Connects through KUBECONFIG.
#[tokio::test]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn one_watch_per_resource_and_changes_propagate() {
    let (_turn, cp) = or_return!(control_plane_or_skip().await);
    cp.grant_proxy_cluster_wide().await;
    for ns in ["shared", "late"] {
        cp.create_namespace(ns).await;
    }
    create_flag(&cp, "shared", "flags", "red").await;
    let kubeconfig = cp.proxy_kubeconfig().display().to_string();
    let proxy =
        Proxy::start_with_env(&["--idle-timeout", "1s"], &[("KUBECONFIG", &kubeconfig)]).await;
    assert_eq!(cp.open_watches("featureflags").await, 0);

    // 20 subscribers, over two connections.
    let shared = selector("shared", "flags");
    let mut clients = [client(&proxy).await, client(&proxy).await];
    let mut streams = Vec::new();
    for i in 0..20 {
        let stream = open(&mut clients[i % 2], &shared)
            .await
            .expect("stream opened");
        streams.push(stream);
    }
    for stream in &mut streams {
        assert_eq!(next_variant(stream).await, "red");
    }
    cp.wait_for_open_watches("featureflags", 1).await;
    assert_eq!(proxy.metric("flagd_proxy_upstream_watches").await, 1.0);

    // An update reaches every stream.
    set_variant(&cp, "shared", "flags", "blue").await;
    for stream in &mut streams {
        wait_for_variant(stream, "blue").await;
    }

    // A deletion keeps the streams open with the last flags...
    delete_flag(&cp, "shared", "flags").await;
    wait_for_log_line(&proxy, &["resource not found", &shared]).await;
    let fetched = fetch(&mut clients[0], &shared)
        .await
        .expect("the last flags are still served");
    assert_eq!(
        default_variant(&fetched.flag_configuration, "color"),
        "blue"
    );
    // ... and a re-creation delivers the new content, as the next message of every stream:
    // nothing was sent for the deletion.
    create_flag(&cp, "shared", "flags", "green").await;
    for stream in &mut streams {
        assert_eq!(
            next_variant(stream).await,
            "green",
            "the message after the deletion is the re-creation's"
        );
    }
    assert_eq!(cp.open_watches("featureflags").await, 1, "still one watch");

    // The watch closes after the last subscriber has gone (plus the idle time).
    drop(streams);
    cp.wait_for_open_watches("featureflags", 0).await;
    proxy
        .wait_for_metric("flagd_proxy_upstream_watches", 0.0)
        .await;

    // A resource created after its first subscriber arrived.
    let late = selector("late", "flags");
    let mut stream = open(&mut clients[0], &late).await.expect("stream opened");
    cp.wait_for_open_watches("featureflags", 1).await;
    wait_for_log_line(&proxy, &["resource not found", &late]).await;
    create_flag(&cp, "late", "flags", "purple").await;
    assert_eq!(next_variant(&mut stream).await, "purple");

    // FetchAllFlags on a resource that does not exist.
    let status = clients[1]
        .fetch_all_flags(with_selector(
            v1::FetchAllFlagsRequest::default(),
            &selector("late", "missing"),
        ))
        .await
        .expect_err("missing resource");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
}

/// The restricted identity may read namespace A only: B is refused with a message that names
/// the missing permission, A keeps working, and B works once it is granted.
#[tokio::test]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn rbac_refusal_is_explained_and_recovers_when_granted() {
    let (_turn, cp) = or_return!(control_plane_or_skip().await);
    for ns in ["rbac-a", "rbac-b"] {
        cp.create_namespace(ns).await;
        create_flag(&cp, ns, "flags", "red").await;
    }
    cp.grant_proxy_namespace("rbac-a").await;
    let proxy = start_proxy_with_flags(&cp, &["--idle-timeout", "1s"]).await;
    let mut client = client(&proxy).await;

    let a = selector("rbac-a", "flags");
    let mut stream_a = open(&mut client, &a).await.expect("stream for A");
    assert_eq!(next_variant(&mut stream_a).await, "red");

    let b = selector("rbac-b", "flags");
    let status = first_message(&mut client, &b)
        .await
        .expect_err("B is refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    for needle in [
        "RBAC forbids list on featureflags.core.openfeature.dev in namespace \"rbac-b\"",
        "for this proxy's identity: grant get, list, watch",
        "system:serviceaccount:flagd:proxy",
    ] {
        assert!(
            status.message().contains(needle),
            "{needle:?} missing: {status:?}"
        );
    }
    let refused = fetch(&mut client, &b)
        .await
        .expect_err("fetching B is refused too");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let line = wait_for_log_line(&proxy, &["access denied", &b]).await;
    assert!(line.contains("RBAC forbids list"), "{line}");
    assert!(proxy.metric(FORBIDDEN_METRIC).await > 0.0);

    // A is unaffected.
    set_variant(&cp, "rbac-a", "flags", "blue").await;
    wait_for_variant(&mut stream_a, "blue").await;

    // Granting B: a new stream for B works (the watch retries by itself with backoff).
    cp.grant_proxy_namespace("rbac-b").await;
    let message = support::eventually_within("B served after the grant", EVENT_TIMEOUT * 2, || {
        let mut client = client.clone();
        let b = b.clone();
        async move {
            match first_message(&mut client, &b).await {
                Err(status) if status.code() != Code::PermissionDenied => {
                    panic!("unexpected status for B: {status:?}")
                }
                result => result,
            }
        }
    })
    .await;
    assert_eq!(default_variant(&message.flag_configuration, "color"), "red");
    set_variant(&cp, "rbac-a", "flags", "green").await;
    wait_for_variant(&mut stream_a, "green").await;
}

/// The API server is killed and started again (same etcd) under live subscribers; an update made
/// after the restart reaches every one of them.
#[tokio::test]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn subscribers_catch_up_after_an_api_server_restart() {
    let (_turn, mut cp) = or_return!(control_plane_or_skip().await);
    let proxy = proxy_with_red_flag(&cp, "restart", "flags", &[]).await;
    let target = selector("restart", "flags");
    let mut client = client(&proxy).await;
    let mut streams = Vec::new();
    for _ in 0..5 {
        let mut stream = open(&mut client, &target).await.expect("stream opened");
        assert_eq!(next_variant(&mut stream).await, "red");
        streams.push(stream);
    }
    cp.wait_for_open_watches("featureflags", 1).await;

    cp.stop_apiserver().await;
    wait_for_log_line(&proxy, &["source unreachable", &target]).await;
    cp.start_apiserver().await;

    set_variant(&cp, "restart", "flags", "blue").await;
    for stream in &mut streams {
        wait_for_variant(stream, "blue").await;
    }
    // A second update, to show the re-established watch keeps delivering.
    set_variant(&cp, "restart", "flags", "green").await;
    for stream in &mut streams {
        wait_for_variant(stream, "green").await;
    }
    cp.wait_for_open_watches("featureflags", 1).await;
}

/// 200 resources, each with its own subscriber: every stream gets its own resource and the
/// API server sees exactly one watch per resource.
#[tokio::test]
#[ignore = "needs etcd and kube-apiserver: scripts/test installs them"]
async fn many_resources_each_get_their_own_watch() {
    const RESOURCES: usize = 200;
    const CONNECTIONS: usize = 4;
    let (_turn, cp) = or_return!(control_plane_or_skip().await);
    cp.grant_proxy_cluster_wide().await;
    cp.create_namespace("many").await;
    futures::stream::iter(0..RESOURCES)
        .map(|i| {
            let cp = &cp;
            async move { create_flag(cp, "many", &format!("flags-{i}"), &format!("v{i}")).await }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    let proxy = start_proxy_with_flags(&cp, &[]).await;
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(client(&proxy).await);
    }
    let opened = futures::future::join_all((0..RESOURCES).map(|i| {
        let mut client = clients[i % CONNECTIONS].clone();
        async move {
            let mut stream = open(&mut client, &selector("many", &format!("flags-{i}")))
                .await
                .expect("stream opened");
            let variant = next_variant(&mut stream).await;
            (i, variant, stream)
        }
    }))
    .await;
    for (i, variant, _) in &opened {
        assert_eq!(variant, &format!("v{i}"), "stream {i} got another resource");
    }
    cp.wait_for_open_watches("featureflags", RESOURCES as u64)
        .await;
    assert_eq!(
        proxy.metric("flagd_proxy_upstream_watches").await,
        RESOURCES as f64
    );

    // Updates still go to the right streams.
    let mut streams: Vec<_> = opened.into_iter().map(|(_, _, s)| s).collect();
    for i in [0, RESOURCES / 2, RESOURCES - 1] {
        set_variant(&cp, "many", &format!("flags-{i}"), &format!("w{i}")).await;
        wait_for_variant(&mut streams[i], &format!("w{i}")).await;
    }
}
