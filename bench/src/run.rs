//! One scenario against one proxy, run: its own control plane (Kubernetes), the flag sources,
//! the proxy process, then the phases of [`Live`].

use std::path::Path;

use flagd_proxy_testkit::control_plane::ControlPlane;

use crate::args::Args;
use crate::load::{BenchTls, Dial};
use crate::options::SourceKind;
use crate::phases::Live;
use crate::proxy::{Kind, ProxyProcess};
use crate::sampling::RssGuard;
use crate::scenario::{RunResult, Scenario};
use crate::sources::{NAMESPACE, Sources};

/// One scenario against one proxy: a control plane of its own (Kubernetes), the flag sources,
/// the proxy, then the phases of [`Live`] in order.
pub(crate) async fn run_one(
    kind: Kind,
    bin: &Path,
    scenario: Scenario,
    args: &Args,
    workdir: &Path,
) -> anyhow::Result<RunResult> {
    let dir = workdir.join(scenario.dir_name(kind));
    std::fs::create_dir_all(&dir)?;
    let cluster = start_cluster(kind, scenario).await?;
    let sources = Sources::new(
        kind,
        &dir,
        scenario.resources,
        (scenario.payload, args.documents),
        cluster.as_ref(),
    )?;
    sources.write(0, || {}).await?;
    let cold = match &cluster {
        Some(_) => sources.create_cold(args.cold_resources).await?,
        None => Vec::new(),
    };
    let tls = scenario.tls.then(|| BenchTls::new(&dir)).transpose()?;
    let mut proxy = ProxyProcess::start(
        kind,
        bin,
        &dir,
        cluster.as_ref(),
        tls.as_ref(),
        scenario.payload,
        scenario.resources + cold.len() + 16,
        &args.proxy_arg,
    )?;
    sources.attach(proxy.control.take());
    let dial = Dial {
        port: proxy.port,
        tls: tls.as_ref().map(|t| t.client.clone()),
    };
    let guard = RssGuard::spawn(proxy.pid, args.max_rss_mib);
    let result = RunResult {
        proxy: kind.label_in(args).to_owned(),
        document_bytes: sources.document_bytes(),
        ..RunResult::default()
    };
    let mut live = Live::new(kind, scenario, args, proxy, sources, dial, result);
    live.run(cluster.as_ref(), &cold, guard).await?;
    let Live { proxy, result, .. } = live;
    drop(proxy);
    drop(cluster);
    Ok(result)
}

/// A control plane of its own for each Kubernetes run, so no run sees another's watches or
/// objects.
pub(crate) async fn start_cluster(
    kind: Kind,
    scenario: Scenario,
) -> anyhow::Result<Option<ControlPlane>> {
    Ok(match scenario.source {
        _ if kind == Kind::Floor => None,
        SourceKind::Files => None,
        SourceKind::Kubernetes => {
            let cluster = ControlPlane::start().await.map_err(|error| {
                anyhow::anyhow!("starting the test control plane: {error} (scripts/build-control-plane.sh builds it)")
            })?;
            cluster.grant_proxy_cluster_wide().await;
            cluster.create_namespace(NAMESPACE).await;
            Some(cluster)
        }
    })
}
