//! Attacks on start-up: the unix socket's mode under umask 000 (9), reload signals before the
//! handlers were installed (12), and `--context-value` entries that were taken without a
//! word (13). Each starts the proxy many times; none has memory figures.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::scene::{Ctx, Measured, wait_ready};

/// The attack's manifests folder, as an argument.
fn demo_manifests(ctx: &Ctx) -> anyhow::Result<String> {
    Ok(super::scene::demo_manifests(ctx)?.display().to_string())
}

/// Row 9: the proxy started under umask 000 with `--sync-socket-mode 0600`; the socket file's
/// mode at the first moment it exists at its path, watched by a thread that looks for it
/// without pause. Another uid connecting is not tried: switching uid needs root, which the
/// sitting does not have; a mode open to others at that moment is what let it in.
pub(crate) async fn socket_mode(ctx: &Ctx) -> anyhow::Result<Measured> {
    let wrapper = ctx.dir.join("umask-000");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\numask 000\nexec '{}' \"$@\"\n",
            ctx.bin.display()
        ),
    )?;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    let manifests = demo_manifests(ctx)?;
    let mut modes: BTreeMap<String, usize> = BTreeMap::new();
    let mut open = 0;
    for i in 0..ctx.sizes.starts {
        let socket = ctx.dir.join(format!("sync-{i}.sock"));
        let args = [
            "--manifests".to_owned(),
            manifests.clone(),
            "--sync-socket-path".to_owned(),
            socket.display().to_string(),
            "--sync-socket-mode".to_owned(),
            "0600".to_owned(),
        ];
        let log = ctx.dir.join(format!("proxy-{i}.log"));
        let proxy = ctx.launch(&wrapper, &args, log).await?;
        let first = tokio::task::spawn_blocking(move || first_mode(&socket)).await?;
        drop(proxy);
        let seen = match first {
            Some(mode) => {
                open += usize::from(mode & 0o077 != 0);
                format!("{mode:04o}")
            }
            None => "none".to_owned(),
        };
        *modes.entry(seen).or_default() += 1;
    }
    let modes: Vec<String> = modes.iter().map(|(m, n)| format!("{m} in {n}")).collect();
    Ok(Measured::outcome(format!(
        "open to other uids at first sight in {open} of {} starts (first mode: {})",
        ctx.sizes.starts,
        modes.join(", ")
    )))
}

/// The permission bits of `path` at the first moment it exists (within 20 s).
fn first_mode(path: &Path) -> Option<u32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            return Some(meta.permissions().mode() & 0o7777);
        }
        std::thread::yield_now();
    }
    None
}

/// Row 12: SIGHUP and SIGUSR1 sent 0 to 190 ms after the process started (spread evenly over
/// the starts); whether it is alive and serving afterwards.
pub(crate) async fn early_signals(ctx: &Ctx) -> anyhow::Result<Measured> {
    let manifests = demo_manifests(ctx)?;
    let starts = ctx.sizes.starts;
    let (mut alive, mut died) = (0, Vec::new());
    for i in 0..starts {
        let args = ["--manifests".to_owned(), manifests.clone()];
        let log = ctx.dir.join(format!("proxy-{i}.log"));
        let mut proxy = ctx.launch(&ctx.bin, &args, log).await?;
        let delay = 200 * i as u64 / starts as u64;
        tokio::time::sleep(Duration::from_millis(delay)).await;
        for signal in ["-HUP", "-USR1"] {
            Command::new("kill")
                .args([signal, &proxy.pid.to_string()])
                .stderr(Stdio::null())
                .status()?;
        }
        if wait_ready(&mut proxy).await.is_ok() && proxy.exited().is_none() {
            alive += 1;
        } else {
            died.push(format!("{delay} ms"));
        }
    }
    let died = if died.is_empty() {
        String::new()
    } else {
        format!(
            " (ended: the signals sent {} after the start)",
            died.join(", ")
        )
    };
    Ok(Measured::outcome(format!(
        "alive and serving after the signals in {alive} of {starts} starts{died}"
    )))
}

/// Row 13: the `--context-value` entries of `attacks::context`: a value of 100 KB, keys that
/// name the message's own fields or look like the proxy's own keys, and `rev`. For each, the
/// exit status, or `served` when the proxy started with it.
pub(crate) async fn context_values(ctx: &Ctx) -> anyhow::Result<Measured> {
    let manifests = demo_manifests(ctx)?;
    let cases = flagd_proxy_testkit::attacks::context::entries();
    let mut outcomes = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let args = [
            "--manifests".to_owned(),
            manifests.clone(),
            "--context-value".to_owned(),
            case.entry.clone(),
        ];
        let log = ctx.dir.join(format!("proxy-{i}.log"));
        let mut proxy = ctx.launch(&ctx.bin, &args, log).await?;
        let answer = match wait_ready(&mut proxy).await {
            Ok(()) => "served".to_owned(),
            Err(_) => match proxy.exited().and_then(|s| s.code()) {
                Some(code) => format!("exit {code}"),
                None => "neither served nor exited".to_owned(),
            },
        };
        let expected = if case.refused {
            format!(
                "exit {}",
                flagd_proxy_testkit::attacks::context::EXIT_STATUS
            )
        } else {
            "served".to_owned()
        };
        let unexpected = if answer == expected {
            String::new()
        } else {
            format!(" (expected: {expected})")
        };
        outcomes.push(format!("{}: {answer}{unexpected}", case.what));
    }
    Ok(Measured::outcome(outcomes.join("; ")))
}
