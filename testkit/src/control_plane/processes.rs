//! The server processes: each runs under a small `sh` wrapper that kills it when the pipe from
//! the test process closes, so nothing outlives an interrupted test binary; plus free loopback
//! ports, health polling and log tails.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};

use super::{PROBE_TIMEOUT, READY_TIMEOUT};
use crate::http_get_whole;

/// Runs a server process under `sh`, which kills it when the pipe on the wrapper's stdin closes:
/// on [`Supervised::stop`], or when the test process dies. A line on the pipe names a signal to
/// send the server first ([`Supervised::terminate`]). The wrapper's exit status is the server's.
const SUPERVISOR_SCRIPT: &str = r#"
exec 3<&0 </dev/null
"$@" 3<&- &
server=$!
(
  while read -r signal <&3; do kill -"$signal" "$server" 2>/dev/null; done
  kill -KILL "$server" 2>/dev/null
) &
watcher=$!
exec 3<&-
wait "$server"
status=$?
kill "$watcher" 2>/dev/null
exit "$status"
"#;

pub(crate) struct Supervised {
    name: &'static str,
    child: Child,
    lifeline: Option<ChildStdin>,
    log: PathBuf,
    exit: Option<ExitStatus>,
}

impl Supervised {
    pub(crate) fn spawn(
        name: &'static str,
        program: &Path,
        args: &[String],
        log: &Path,
        cwd: &Path,
    ) -> anyhow::Result<Self> {
        let log_file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let log_file_2 = log_file
            .try_clone()
            .with_context(|| format!("opening {}", log.display()))?;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(SUPERVISOR_SCRIPT)
            .arg(name)
            .arg(program)
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::from(log_file))
            .stderr(Stdio::from(log_file_2))
            .spawn()
            .with_context(|| format!("starting {} under sh", program.display()))?;
        let lifeline = child.stdin.take();
        Ok(Supervised {
            name,
            child,
            lifeline,
            log: log.to_path_buf(),
            exit: None,
        })
    }

    /// The exit status if the process has ended.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// An error naming the process, with the end of its log.
    pub(crate) fn failure(&self, what: &str) -> anyhow::Error {
        anyhow!(
            "{} {what}\n---- last lines of {} ----\n{}",
            self.name,
            self.log.display(),
            tail(&self.log, 30)
        )
    }

    /// The server's name.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// Asks the server to stop (SIGTERM); [`Supervised::stop`] kills what is left.
    pub(crate) fn terminate(&mut self) {
        if let Some(lifeline) = self.lifeline.as_mut() {
            let _ = lifeline.write_all(b"TERM\n");
        }
    }

    /// Kills the server and reaps the wrapper.
    pub(crate) fn stop(&mut self) {
        // Closing the pipe makes the wrapper kill the server and exit with its status.
        drop(self.lifeline.take());
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.exited().is_none() {
            if Instant::now() >= deadline {
                eprintln!(
                    "{} (wrapper pid {}) did not stop; killing the wrapper",
                    self.name,
                    self.child.id()
                );
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Polls etcd's `/health` until it reports healthy.
pub(super) async fn wait_for_etcd(etcd: &mut Supervised, port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut pause = Duration::from_millis(50);
    loop {
        if let Some(status) = etcd.exited() {
            return Err(etcd.failure(&format!("exited ({status}) before becoming healthy")));
        }
        let last = match tokio::time::timeout(PROBE_TIMEOUT, http_get_whole(port, "/health")).await
        {
            Ok(Ok((_, body))) if body.contains("\"health\":\"true\"") => return Ok(()),
            Ok(Ok((status, body))) => format!("{status} {body}"),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_owned(),
        };
        if Instant::now() >= deadline {
            return Err(etcd.failure(&format!(
                "not healthy after {READY_TIMEOUT:?}; last /health answer: {last}"
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// A port on 127.0.0.1 that was free a moment ago and that this process has not handed out
/// before (the kernel may offer a just-released port again, which two servers of one test would
/// then both try to bind).
pub fn free_port() -> anyhow::Result<u16> {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    for _ in 0..100 {
        let listener = TcpListener::bind(("127.0.0.1", 0)).context("binding 127.0.0.1:0")?;
        let port = listener
            .local_addr()
            .context("reading the bound port")?
            .port();
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return Ok(port);
        }
    }
    anyhow::bail!("127.0.0.1 kept offering ports this process already handed out")
}

pub(super) fn log_mentions_port_clash(log: &Path) -> bool {
    tail(log, 200).contains("address already in use")
}

/// The last `lines` lines of a file (at most its last 64 KiB).
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let read = || -> std::io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(could not read {}: {e})", path.display()),
    }
}
