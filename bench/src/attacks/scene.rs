//! A fresh proxy for one attack, what is measured of it, and the clients every attack uses.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use flagd_proxy_testkit::client::{Client, v1, with_selector};
use flagd_proxy_testkit::{string_flag, write_manifest};
use serde_json::Value;
use tonic::Status;
use tonic::transport::Endpoint;

use super::{Sizes, table};
use crate::proxy::ProxyProcess;
use crate::sampling::{RssGuard, proc_sample};

/// The resource every scene serves.
pub(crate) const SELECTOR: &str = "core.openfeature.dev/default/demo";

/// What one attack needs to know.
pub(crate) struct Ctx {
    pub(crate) bin: PathBuf,
    /// The attack's own folder.
    pub(crate) dir: PathBuf,
    pub(crate) sizes: Sizes,
    pub(crate) quiet: Duration,
    pub(crate) max_rss_mib: u64,
    /// `--proxy-arg`s, for the build under test only (the attacks on a running proxy).
    pub(crate) extra: Vec<String>,
}

/// What one attack measured against one build.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub(crate) struct Measured {
    /// RSS once the proxy was ready, before the attack (KiB).
    pub(crate) start_kib: Option<u64>,
    /// The proxy's peak RSS during the attack (KiB).
    pub(crate) peak_kib: Option<u64>,
    /// RSS after the attacker had gone and the quiet time had passed (KiB).
    pub(crate) after_kib: Option<u64>,
    /// What the attack achieved.
    pub(crate) outcome: String,
    /// Why the attack has no figure.
    pub(crate) failed: Option<String>,
}

impl Measured {
    pub(crate) fn failed(why: String) -> Self {
        Self {
            failed: Some(why),
            ..Self::default()
        }
    }

    /// An outcome with no memory figures (the attack is on start-up, not on a running proxy).
    pub(crate) fn outcome(outcome: String) -> Self {
        Self {
            outcome,
            ..Self::default()
        }
    }

    pub(crate) fn summary(&self) -> String {
        match &self.failed {
            Some(why) => format!("failed: {why}"),
            None => format!(
                "{} / {} / {}",
                table::during(self),
                table::after(self),
                self.outcome
            ),
        }
    }
}

/// A proxy on manifest files serving `default/demo`, killed on drop.
pub(crate) struct Scene {
    pub(crate) proxy: ProxyProcess,
    pub(crate) manifests: PathBuf,
    start_kib: u64,
    _guard: RssGuard,
}

impl Scene {
    /// Starts the proxy with `extra` flags and waits until it is ready.
    pub(crate) async fn start(ctx: &Ctx, extra: &[&str]) -> anyhow::Result<Scene> {
        let manifests = demo_manifests(ctx)?;
        let mut args = vec!["--manifests".to_owned(), manifests.display().to_string()];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args.extend(ctx.extra.iter().cloned());
        let mut proxy = ProxyProcess::launch(&ctx.bin, &args, ctx.dir.join("proxy.log"))?;
        wait_ready(&mut proxy).await?;
        let guard = RssGuard::spawn(proxy.pid, ctx.max_rss_mib);
        Ok(Scene {
            start_kib: proc_sample(proxy.pid).rss_kib,
            manifests,
            proxy,
            _guard: guard,
        })
    }

    /// The figures, once the attacker has gone: the peak so far, then RSS after the quiet time.
    pub(crate) async fn measure(&self, ctx: &Ctx, outcome: String) -> Measured {
        let peak_kib = proc_sample(self.proxy.pid).hwm_kib;
        tokio::time::sleep(ctx.quiet).await;
        Measured {
            start_kib: Some(self.start_kib),
            peak_kib: Some(peak_kib),
            after_kib: Some(proc_sample(self.proxy.pid).rss_kib),
            outcome,
            failed: None,
        }
    }

    /// A client of the sync port with the default message size limit (4 MiB).
    pub(crate) async fn client(&self) -> anyhow::Result<Client> {
        let channel = Endpoint::from_shared(format!("http://127.0.0.1:{}", self.proxy.port))?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await?;
        Ok(Client::new(channel))
    }

    /// Writes version `color` of `default/demo`.
    pub(crate) fn change(&self, color: &str) {
        write_manifest(
            &self.manifests,
            "default",
            "demo",
            string_flag("color", color, &[color, "v0"]),
        );
    }

    /// The sum of `flagd_proxy_rejected_requests_total` over its reasons.
    pub(crate) async fn rejected(&self) -> f64 {
        self.metric("flagd_proxy_rejected_requests_total").await
    }

    /// The sum of the samples of the metric `name` on `/metrics`, over its labels (0 when there
    /// is none).
    pub(crate) async fn metric(&self, name: &str) -> f64 {
        let metrics = flagd_proxy_testkit::http_get(self.proxy.management_port, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default();
        flagd_proxy::introspection::Samples::parse(&metrics).sum(name)
    }
}

/// The attack's manifests folder, serving `default/demo` (version `v0`).
pub(crate) fn demo_manifests(ctx: &Ctx) -> anyhow::Result<PathBuf> {
    let manifests = ctx.dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    write_manifest(
        &manifests,
        "default",
        "demo",
        string_flag("color", "v0", &["v0", "v1"]),
    );
    Ok(manifests)
}

/// Opens a `flagd.sync.v1` stream of `default/demo`.
pub(crate) async fn subscribe(
    client: &mut Client,
) -> anyhow::Result<tonic::Streaming<v1::SyncFlagsResponse>> {
    let request = with_selector(v1::SyncFlagsRequest::default(), SELECTOR);
    Ok(client.sync_flags(request).await?.into_inner())
}

/// The next message of `stream` within `within`: `Ok(None)` when none came in time, `Err` with
/// the status that ended it.
pub(crate) async fn next_within(
    stream: &mut tonic::Streaming<v1::SyncFlagsResponse>,
    within: Duration,
) -> Result<Option<v1::SyncFlagsResponse>, Status> {
    match tokio::time::timeout(within, stream.message()).await {
        Err(_) => Ok(None),
        Ok(Ok(Some(message))) => Ok(Some(message)),
        Ok(Ok(None)) => Err(Status::unknown("the stream ended with OK")),
        Ok(Err(status)) => Err(status),
    }
}

/// The default variant of `color` in a message.
pub(crate) fn color(message: &v1::SyncFlagsResponse) -> String {
    serde_json::from_str::<Value>(&message.flag_configuration)
        .ok()
        .and_then(|doc| {
            doc["flags"]["color"]["defaultVariant"]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

/// Waits until the proxy answers `/readyz` with 200; the error when it exits first or takes
/// more than a minute.
pub(crate) async fn wait_ready(proxy: &mut ProxyProcess) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = proxy.exited() {
            bail!("the proxy exited ({status}):\n{}", proxy.log_tail());
        }
        if let Ok((200, _)) = flagd_proxy_testkit::http_get(proxy.management_port, "/readyz").await
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the proxy is not ready after 60 s:\n{}", proxy.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A number with thousands separators.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
