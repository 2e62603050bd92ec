//! Samples of the proxy under soak: from /proc (RSS, open file descriptors, threads) and from
//! its `/metrics` (streams, connections, watches, resources waited on, metric series, versions
//! published). The proxy exports no count of its tokio tasks; its tasks are per connection,
//! per stream and per watch, which are counted here.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flagd_proxy::introspection::{Process, Samples};

/// What the sampler is sampling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Phase {
    WarmUp,
    Churn,
    CoolDown,
}

impl Phase {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Phase::WarmUp,
            1 => Phase::Churn,
            _ => Phase::CoolDown,
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            Phase::WarmUp => 0,
            Phase::Churn => 1,
            Phase::CoolDown => 2,
        }
    }
}

/// One sample of the proxy. A figure the proxy did not give (its `/metrics` did not answer, or
/// lacked the metric) is `None`.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct Sample {
    /// Seconds since the soak began.
    pub(crate) at_seconds: f64,
    pub(crate) phase: Phase,
    /// VmRSS, KiB.
    pub(crate) rss_kib: Option<f64>,
    /// Entries of /proc/<pid>/fd.
    pub(crate) fds: Option<f64>,
    /// `Threads:` of /proc/<pid>/status.
    pub(crate) threads: Option<f64>,
    /// `sync_active_streams`.
    pub(crate) streams: Option<f64>,
    /// `flagd_proxy_open_connections{port="sync"}`.
    pub(crate) connections: Option<f64>,
    /// `flagd_proxy_upstream_watches`.
    pub(crate) watches: Option<f64>,
    /// `flagd_proxy_waiting_resources`.
    pub(crate) waiting: Option<f64>,
    /// Sample lines of `/metrics` (every label set of every metric).
    pub(crate) series: Option<f64>,
    /// `flagd_proxy_versions_published_total`.
    pub(crate) published: Option<f64>,
    /// `flagd_proxy_updates_sent_total`, over every protocol.
    pub(crate) updates_sent: Option<f64>,
    /// CPU time of the proxy (user + system), seconds.
    pub(crate) cpu_seconds: f64,
    /// CPU time of this load generator, seconds.
    pub(crate) load_generator_cpu_seconds: f64,
}

/// Samples the proxy `pid`, whose management port is `management_port`. /proc is read first,
/// so the connection that fetches `/metrics` is not among the open files.
pub(crate) fn take(pid: u32, management_port: u16, began: Instant, phase: Phase) -> Sample {
    let process = Process::Id(pid);
    let status = process.status().ok();
    let field = |name: &str| status.as_ref()?.number(name).map(|v| v as f64);
    let fds = process.open_files().ok().map(|count| count as f64);
    let (rss_kib, threads) = (field("VmRSS"), field("Threads"));
    let metrics = fetch_metrics(management_port).ok();
    let metric = |name: &str| metrics.as_ref().and_then(|m| m.get(name));
    let sum = |name: &str| metrics.as_ref().map(|m| m.sum(name));
    Sample {
        at_seconds: began.elapsed().as_secs_f64(),
        phase,
        rss_kib,
        fds,
        threads,
        streams: metric("sync_active_streams"),
        connections: metric("flagd_proxy_open_connections{port=\"sync\"}"),
        watches: metric("flagd_proxy_upstream_watches"),
        waiting: metric("flagd_proxy_waiting_resources"),
        series: metrics.as_ref().map(|m| m.len() as f64),
        published: metric("flagd_proxy_versions_published_total"),
        updates_sent: sum("flagd_proxy_updates_sent_total"),
        cpu_seconds: crate::sampling::proc_sample(pid).cpu_seconds,
        load_generator_cpu_seconds: crate::sampling::proc_sample(std::process::id()).cpu_seconds,
    }
}

/// `GET /metrics` on the management port (HTTP/1.1, 5 s to connect and to answer): its samples.
pub(crate) fn fetch_metrics(port: u16) -> std::io::Result<Samples> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response);
    if !text.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other("/metrics did not answer 200"));
    }
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    Ok(Samples::parse(body))
}

/// Samples the proxy every `every` from a thread of its own (so the load generator's backlog
/// does not delay it), until dropped.
pub(crate) struct Sampler {
    pub(crate) samples: Arc<Mutex<Vec<Sample>>>,
    phase: Arc<AtomicU8>,
    running: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    pub(crate) fn spawn(pid: u32, management_port: u16, began: Instant, every: Duration) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let phase = Arc::new(AtomicU8::new(Phase::WarmUp.to_u8()));
        let running = Arc::new(AtomicBool::new(true));
        let (ours, current, on) = (samples.clone(), phase.clone(), running.clone());
        let thread = std::thread::spawn(move || {
            while on.load(Ordering::Relaxed) {
                let phase = Phase::from_u8(current.load(Ordering::Relaxed));
                let sample = take(pid, management_port, began, phase);
                lock(&ours).push(sample);
                // Sleep in short steps, so that dropping the sampler does not wait long.
                let next = Instant::now() + every;
                while on.load(Ordering::Relaxed) && Instant::now() < next {
                    std::thread::sleep(Duration::from_millis(50).min(every));
                }
            }
        });
        Self {
            samples,
            phase,
            running,
            thread: Some(thread),
        }
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        self.phase.store(phase.to_u8(), Ordering::Relaxed);
    }

    /// Adds a sample taken elsewhere (the baseline, the end).
    pub(crate) fn push(&self, sample: Sample) {
        lock(&self.samples).push(sample);
    }

    /// Stops the sampling; every sample taken.
    pub(crate) fn stop(self) -> Vec<Sample> {
        let samples = lock(&self.samples).clone();
        drop(self);
        samples
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
