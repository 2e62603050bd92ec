//! A fresh proxy for one attack, what is measured of it, and the clients every attack uses.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use flagd_proxy_testkit::client::{Client, v1, with_selector};
use flagd_proxy_testkit::memory_cgroup::MemoryCgroup;
use flagd_proxy_testkit::{TestCa, string_flag, write_manifest};
use serde_json::Value;
use tonic::Status;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use super::kernel::{BUDGET_REFUSALS, Kernel};
use super::{Sizes, table};
use crate::options::Tier;
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
    /// With `--attacks-tiers`: the tier whose budget the proxy gets, and the cgroup at its
    /// limit that every proxy of the attack runs in.
    pub(crate) tier: Option<(Tier, Arc<MemoryCgroup>)>,
}

impl Ctx {
    /// Starts `program` (the proxy, or a script that becomes it) with `args`, in the tier's
    /// cgroup with the tier's budget (unless `args` name one) when there is a tier. Returns
    /// once the proxy's binary runs, as a plain start does: the shell that joins the cgroup
    /// has become it (a signal sent earlier would be the shell's).
    pub(crate) async fn launch(
        &self,
        program: &Path,
        args: &[String],
        log: PathBuf,
    ) -> anyhow::Result<ProxyProcess> {
        let Some((tier, cgroup)) = &self.tier else {
            return ProxyProcess::launch(program, args, log);
        };
        let mut args = args.to_vec();
        if !args.iter().any(|a| a.starts_with("--memory-budget")) {
            args.extend(["--memory-budget".to_owned(), tier.budget().to_owned()]);
        }
        let mut proxy = ProxyProcess::launch_as(cgroup.command(program), &args, log)?;
        if program == self.bin {
            let bin = std::fs::canonicalize(&self.bin)?;
            let exe = PathBuf::from(format!("/proc/{}/exe", proxy.pid));
            let deadline = Instant::now() + Duration::from_secs(10);
            // A proxy that exits at once (a flag it refuses) may be gone before it is seen.
            while std::fs::read_link(&exe).ok().as_ref() != Some(&bin) && proxy.exited().is_none() {
                if Instant::now() > deadline {
                    bail!("process {} never became {}", proxy.pid, bin.display());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        Ok(proxy)
    }
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
    /// With `--attacks-tiers`: what the kernel and the clients saw.
    pub(crate) kernel: Option<Kernel>,
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
    /// How clients reach a proxy that serves TLS.
    tls: Option<ClientTlsConfig>,
    /// With a tier: a subscriber established before the attack.
    subscriber: tokio::sync::Mutex<Option<tonic::Streaming<v1::SyncFlagsResponse>>>,
    _guard: RssGuard,
}

impl Scene {
    /// Starts the proxy with `extra` flags and waits until it is ready.
    pub(crate) async fn start(ctx: &Ctx, extra: &[&str]) -> anyhow::Result<Scene> {
        Self::start_with(ctx, extra, None).await
    }

    /// [`Scene::start`] of a proxy serving TLS with `ca`'s server certificate (given in `extra`
    /// too), its clients trusting `ca`.
    pub(crate) async fn start_tls(ctx: &Ctx, extra: &[&str], ca: &TestCa) -> anyhow::Result<Scene> {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(std::fs::read(&ca.ca_cert)?))
            .domain_name("localhost");
        Self::start_with(ctx, extra, Some(tls)).await
    }

    async fn start_with(
        ctx: &Ctx,
        extra: &[&str],
        tls: Option<ClientTlsConfig>,
    ) -> anyhow::Result<Scene> {
        let manifests = demo_manifests(ctx)?;
        let mut args = vec!["--manifests".to_owned(), manifests.display().to_string()];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args.extend(ctx.extra.iter().cloned());
        let mut proxy = ctx
            .launch(&ctx.bin, &args, ctx.dir.join("proxy.log"))
            .await?;
        wait_ready(&mut proxy).await?;
        let guard = RssGuard::spawn(proxy.pid, ctx.max_rss_mib);
        let mut scene = Scene {
            start_kib: proc_sample(proxy.pid).rss_kib,
            manifests,
            proxy,
            tls,
            subscriber: tokio::sync::Mutex::new(None),
            _guard: guard,
        };
        if ctx.tier.is_some() {
            let mut stream = subscribe(&mut scene.client().await?).await?;
            next_within(&mut stream, JUDGE_WAIT).await?.ok_or_else(|| {
                anyhow::anyhow!("the established subscriber got no first version")
            })?;
            scene.subscriber = tokio::sync::Mutex::new(Some(stream));
        }
        Ok(scene)
    }

    /// The figures, once the attacker has gone: the peak so far, then RSS after the quiet time.
    pub(crate) async fn measure(&self, ctx: &Ctx, outcome: String) -> Measured {
        let peak_kib = proc_sample(self.proxy.pid).hwm_kib;
        tokio::time::sleep(ctx.quiet).await;
        let after_kib = Some(proc_sample(self.proxy.pid).rss_kib);
        let kernel = match ctx.tier {
            Some(_) => Some(self.judge().await),
            None => None,
        };
        Measured {
            start_kib: Some(self.start_kib),
            peak_kib: Some(peak_kib),
            after_kib,
            outcome,
            failed: None,
            kernel,
        }
    }

    /// After the attack: whether the established subscriber gets an edit written now, whether
    /// a new client gets in (and that edit), and the budget's refusals so far.
    async fn judge(&self) -> Kernel {
        const EDIT: &str = "after-attack";
        self.change(EDIT);
        let subscriber = match self.subscriber.lock().await.as_mut() {
            Some(stream) => got(stream, EDIT).await,
            None => "no subscriber".to_owned(),
        };
        let new_client = async {
            let mut stream = subscribe(&mut self.client().await?).await?;
            anyhow::Ok(got(&mut stream, EDIT).await)
        };
        let new_client = match new_client.await {
            Ok(answer) => answer,
            Err(error) => format!("no: {}", short(&format!("{error:#}"))),
        };
        let budget_refusals = match self.sample(BUDGET_REFUSALS).await {
            Some(n) => format!("{n}"),
            None => "unread: the proxy is gone".to_owned(),
        };
        Kernel {
            budget_refusals: Some(budget_refusals),
            subscriber: Some(subscriber),
            new_client: Some(new_client),
            ..Kernel::default()
        }
    }

    /// A client of the sync port with the default message size limit (4 MiB).
    pub(crate) async fn client(&self) -> anyhow::Result<Client> {
        let (scheme, tls) = match &self.tls {
            Some(tls) => ("https", Some(tls.clone())),
            None => ("http", None),
        };
        let mut endpoint =
            Endpoint::from_shared(format!("{scheme}://127.0.0.1:{}", self.proxy.port))?
                .connect_timeout(Duration::from_secs(5));
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls)?;
        }
        Ok(Client::new(endpoint.connect().await?))
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

    /// The value of `sample` (`name{labels}`) on `/metrics`: 0 when it has none, `None` when
    /// the management port does not answer.
    pub(crate) async fn sample(&self, sample: &str) -> Option<f64> {
        let (_, metrics) = flagd_proxy_testkit::http_get(self.proxy.management_port, "/metrics")
            .await
            .ok()?;
        Some(
            flagd_proxy::introspection::Samples::parse(&metrics)
                .get(sample)
                .unwrap_or(0.0),
        )
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

/// How long a judging client waits for what must come.
const JUDGE_WAIT: Duration = Duration::from_secs(10);

/// `yes` when `stream` delivers the version of `color` within [`JUDGE_WAIT`], else why not.
async fn got(stream: &mut tonic::Streaming<v1::SyncFlagsResponse>, want: &str) -> String {
    let deadline = tokio::time::Instant::now() + JUDGE_WAIT;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match next_within(stream, left).await {
            Ok(Some(message)) if color(&message) == want => return "yes".to_owned(),
            Ok(Some(_)) => {}
            Ok(None) => return format!("no: nothing within {} s", JUDGE_WAIT.as_secs()),
            Err(status) => {
                return format!("no: {:?} {}", status.code(), short(status.message()));
            }
        }
    }
}

/// The first 80 characters of `text`, on one line.
fn short(text: &str) -> String {
    text.replace('\n', " ").chars().take(80).collect()
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
