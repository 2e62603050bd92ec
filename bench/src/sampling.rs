//! Process sampling: CPU time and memory from /proc, the open-file limit, and a guard that
//! kills a process whose memory runs away.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use flagd_proxy::introspection::Process;

/// CPU time and memory of a process, from /proc.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ProcSample {
    pub(crate) cpu_seconds: f64,
    pub(crate) rss_kib: u64,
    pub(crate) hwm_kib: u64,
}

pub(crate) fn proc_sample(pid: u32) -> ProcSample {
    let process = Process::Id(pid);
    let status = process.status().ok();
    let kib = |name: &str| status.as_ref().and_then(|s| s.number(name)).unwrap_or(0);
    ProcSample {
        cpu_seconds: process.cpu_seconds().unwrap_or(0.0),
        rss_kib: kib("VmRSS"),
        hwm_kib: kib("VmHWM"),
    }
}

/// Bytes a process has written through write(2) and its kin, sockets included (`wchar` of
/// /proc/PID/io); 0 when it cannot be read.
pub(crate) fn written_bytes(pid: u32) -> u64 {
    Process::Id(pid)
        .io()
        .ok()
        .and_then(|io| io.number("wchar"))
        .unwrap_or(0)
}

/// Raises the open-file limit (inherited by the proxies started later) to at least `want`.
pub(crate) fn raise_fd_limit(want: usize) -> anyhow::Result<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let want = want as u64;
    // `None` is RLIM_INFINITY.
    let limit = getrlimit(Resource::Nofile);
    let current = limit.current.unwrap_or(u64::MAX);
    let max = limit.maximum.unwrap_or(u64::MAX);
    if current >= want {
        return Ok(());
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    let raised = Rlimit {
        current: Some(want.min(nr_open)),
        maximum: Some(max.max(want.min(nr_open))),
    };
    if setrlimit(Resource::Nofile, raised).is_ok() {
        return Ok(());
    }
    // Not allowed to raise the hard limit: take what there is.
    let capped = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    let _ = setrlimit(Resource::Nofile, capped);
    if max < want {
        eprintln!("warning: open-file limit is {max} (hard), below the {want} this run needs");
    }
    Ok(())
}

/// Kills a process whose RSS goes over a limit, so a proxy that cannot cope does not take the
/// machine down with it.
pub(crate) struct RssGuard {
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) killed: Arc<std::sync::atomic::AtomicBool>,
}

impl RssGuard {
    pub(crate) fn spawn(pid: u32, limit_mib: u64) -> Self {
        let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = killed.clone();
        let task = tokio::spawn(async move {
            loop {
                if proc_sample(pid).rss_kib > limit_mib * 1024 {
                    eprintln!("  RSS over {limit_mib} MiB: killing process {pid}");
                    let _ = Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .status();
                    flag.store(true, Ordering::Relaxed);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self { task, killed }
    }

    pub(crate) fn killed(&self) -> bool {
        self.killed.load(Ordering::Relaxed)
    }
}

impl Drop for RssGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

pub(crate) fn ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}
