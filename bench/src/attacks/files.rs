//! Attacks through the manifests folder: YAML aliases that expand out of proportion (7), and
//! brackets in quoted scalars that hid nesting from the pre-check (8).

use std::time::{Duration, Instant};

use anyhow::Context;
use flagd_proxy::introspection::StatusPage;
use flagd_proxy_testkit::attacks::yaml;
use flagd_proxy_testkit::write_atomically;

use super::scene::{self, Ctx, Measured, Scene, color, next_within, subscribe};
use crate::sampling::proc_sample;

/// How long a hostile file may take to be reported.
const REPORTED_WITHIN: Duration = Duration::from_secs(90);

/// Row 7: one anchor referenced many times (100 KB × 20,000: 2 GB expanded, a 369 KB file).
pub(crate) async fn aliases(ctx: &Ctx) -> anyhow::Result<Measured> {
    let scene = Scene::start(ctx, &[]).await?;
    let yaml = yaml::aliases(ctx.sizes.anchor_bytes, ctx.sizes.anchor_refs);
    write_atomically(&scene.manifests.join("aliases.yaml"), &yaml);
    let reported = reported(&scene, "aliases.yaml").await;
    let outcome = format!(
        "a {} KB file ({} × {} KB anchor): {}",
        yaml.len() / 1000,
        scene::thousands(ctx.sizes.anchor_refs as u64),
        ctx.sizes.anchor_bytes / 1000,
        reported
    );
    Ok(scene.measure(ctx, outcome).await)
}

/// Row 8: flow mappings nested through quoted scalars holding closing brackets (`{a: "}", b:
/// …`), and right after it an edit of another file, which a subscriber waits for.
pub(crate) async fn quoted_brackets(ctx: &Ctx) -> anyhow::Result<Measured> {
    let scene = Scene::start(ctx, &[]).await?;
    let mut client = scene.client().await?;
    let mut stream = subscribe(&mut client).await?;
    next_within(&mut stream, REPORTED_WITHIN)
        .await?
        .context("no first version")?;
    let cpu_before = proc_sample(scene.proxy.pid).cpu_seconds;
    let quoted = yaml::quoted_brackets(ctx.sizes.quoted_bytes);
    write_atomically(&scene.manifests.join("quoted.yaml"), &quoted);
    let written = Instant::now();
    scene.change("v1");
    let edit = loop {
        let left = REPORTED_WITHIN.saturating_sub(written.elapsed());
        match next_within(&mut stream, left).await {
            Ok(Some(message)) if color(&message) == "v1" => {
                break format!(
                    "the other file's edit served after {:.1} s",
                    written.elapsed().as_secs_f64()
                );
            }
            Ok(Some(_)) => {}
            Ok(None) => break "the other file's edit not served within 90 s".to_owned(),
            Err(status) => break format!("the subscriber's stream failed: {:?}", status.code()),
        }
    };
    let reported = reported(&scene, "quoted.yaml").await;
    let cpu = proc_sample(scene.proxy.pid).cpu_seconds - cpu_before;
    let outcome = format!(
        "a {} KB file: {reported}, {cpu:.1} s of CPU; {edit}",
        quoted.len() / 1000
    );
    drop(stream);
    Ok(scene.measure(ctx, outcome).await)
}

/// Whether, and after how long, `/status` names the file `name` among the source's problems.
async fn reported(scene: &Scene, name: &str) -> String {
    let started = Instant::now();
    while started.elapsed() < REPORTED_WITHIN {
        // A process that has exited (or was killed for its RSS) has no VmRSS any more.
        if proc_sample(scene.proxy.pid).rss_kib == 0 {
            return format!(
                "the proxy died after {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        if let Ok((_, body)) =
            flagd_proxy_testkit::http_get_whole(scene.proxy.management_port, "/status").await
            && serde_json::from_str::<StatusPage>(&body).is_ok_and(|page| {
                page.source_status
                    .problems()
                    .iter()
                    .any(|p| p.path.ends_with(name))
            })
        {
            return format!("reported after {:.1} s", started.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    format!("not reported within {} s", REPORTED_WITHIN.as_secs())
}
