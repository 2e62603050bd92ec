//! Memory cgroups that judge a proxy's memory by the kernel: a cgroup of its own with a limit
//! (v1 under `/sys/fs/cgroup/memory`, else a v2 group with the memory controller), a command
//! that joins it before it becomes the program, and what the kernel saw: the peak and its OOM
//! kills. The cgroup is removed when its owner drops it, whatever is still running in it
//! killed first.
//!
//! The test kit starts proxies in a cgroup given by `FLAGD_PROXY_TEST_MEMORY_CGROUP`
//! ([`join_command`]); the benchmark's `--attacks-tiers` makes one per attack
//! ([`MemoryCgroup::create`]).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Where cgroup v1 mounts its memory controller.
const V1_ROOT: &str = "/sys/fs/cgroup/memory";
/// Where a v2 hierarchy is mounted: alone, or beside v1's controllers.
const V2_ROOTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// How long [`Drop`] waits for the processes it killed to leave the cgroup.
const EMPTY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "no memory cgroup hierarchy: neither {V1_ROOT} (v1) nor a v2 hierarchy with the memory \
         controller"
    )]
    NoHierarchy,
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: no {key} in {text:?}", path.display())]
    Missing {
        path: PathBuf,
        key: &'static str,
        text: String,
    },
}

/// Which cgroup interface a group speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    pub fn label(self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }
    }
}

/// A memory cgroup this process made, removed on drop (what runs in it killed first).
#[derive(Debug)]
pub struct MemoryCgroup {
    dir: PathBuf,
    version: Version,
    limit_bytes: u64,
}

impl MemoryCgroup {
    /// Makes a new memory cgroup `<prefix>-<pid>-<n>` at the top of the hierarchy, limited to
    /// `limit_bytes` with no swap beyond it (v1: `memory.limit_in_bytes`, then
    /// `memory.memsw.limit_in_bytes` where swap is accounted, which may not be below the
    /// first; v2: `memory.max`, `memory.swap.max` 0).
    pub fn create(prefix: &str, limit_bytes: u64) -> Result<Self, CgroupError> {
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let (root, version) = hierarchy()?;
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        );
        let dir = root.join(name);
        std::fs::create_dir(&dir).map_err(|source| CgroupError::Io {
            path: dir.clone(),
            source,
        })?;
        // From here on, dropping the group removes the folder, also when a limit is refused.
        let group = Self {
            dir,
            version,
            limit_bytes,
        };
        let limit = limit_bytes.to_string();
        match version {
            Version::V1 => {
                group.write("memory.limit_in_bytes", &limit)?;
                if group.dir.join("memory.memsw.limit_in_bytes").exists() {
                    group.write("memory.memsw.limit_in_bytes", &limit)?;
                }
            }
            Version::V2 => {
                group.write("memory.max", &limit)?;
                if group.dir.join("memory.swap.max").exists() {
                    group.write("memory.swap.max", "0")?;
                }
            }
        }
        Ok(group)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// A command that runs `program` in this cgroup from its first instruction (see
    /// [`join_command`]).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        join_command(&self.dir, program)
    }

    /// The most memory the group has held since it was made (v1 `memory.max_usage_in_bytes`,
    /// v2 `memory.peak`).
    pub fn peak_bytes(&self) -> Result<u64, CgroupError> {
        let file = match self.version {
            Version::V1 => "memory.max_usage_in_bytes",
            Version::V2 => "memory.peak",
        };
        let text = self.read(file)?;
        text.trim().parse().map_err(|_| CgroupError::Missing {
            path: self.dir.join(file),
            key: "number",
            text,
        })
    }

    /// How many processes the kernel killed in this group for want of memory (the `oom_kill`
    /// line of v1 `memory.oom_control`, of v2 `memory.events`).
    pub fn oom_kills(&self) -> Result<u64, CgroupError> {
        let file = match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        let text = self.read(file)?;
        keyed_number(&text, "oom_kill").ok_or_else(|| CgroupError::Missing {
            path: self.dir.join(file),
            key: "oom_kill",
            text,
        })
    }

    /// The processes in the group now.
    pub fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        Ok(self
            .read("cgroup.procs")?
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect())
    }

    fn read(&self, file: &str) -> Result<String, CgroupError> {
        let path = self.dir.join(file);
        std::fs::read_to_string(&path).map_err(|source| CgroupError::Io { path, source })
    }

    fn write(&self, file: &str, value: &str) -> Result<(), CgroupError> {
        let path = self.dir.join(file);
        std::fs::write(&path, value).map_err(|source| CgroupError::Io { path, source })
    }
}

impl Drop for MemoryCgroup {
    /// Kills what still runs in the group, waits until it has left, and removes the group.
    fn drop(&mut self) {
        let deadline = Instant::now() + EMPTY_TIMEOUT;
        loop {
            let pids = self.pids().unwrap_or_default();
            if pids.is_empty() || Instant::now() > deadline {
                break;
            }
            for pid in pids {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // A group is busy for a moment after its last process has left.
        while let Err(error) = std::fs::remove_dir(&self.dir) {
            if Instant::now() > deadline {
                eprintln!("could not remove {}: {error}", self.dir.display());
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The memory hierarchy to make groups in: v1's memory controller, else a v2 hierarchy whose
/// root hands the memory controller to its children.
fn hierarchy() -> Result<(PathBuf, Version), CgroupError> {
    let v1 = Path::new(V1_ROOT);
    if v1.join("memory.limit_in_bytes").exists() {
        return Ok((v1.to_path_buf(), Version::V1));
    }
    for root in V2_ROOTS.map(Path::new) {
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers"));
        if !controllers.is_ok_and(|text| text.split_whitespace().any(|c| c == "memory")) {
            continue;
        }
        let control = root.join("cgroup.subtree_control");
        let enabled = std::fs::read_to_string(&control)
            .is_ok_and(|text| text.split_whitespace().any(|c| c == "memory"));
        if !enabled {
            std::fs::write(&control, "+memory").map_err(|source| CgroupError::Io {
                path: control.clone(),
                source,
            })?;
        }
        return Ok((root.to_path_buf(), Version::V2));
    }
    Err(CgroupError::NoHierarchy)
}

/// The number on the line `<key> <number>` of a cgroup's flat keyed file.
fn keyed_number(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

/// A command that runs `program` in the cgroup at `dir` from its first instruction: a shell
/// joins the cgroup and then becomes `program` (the same process). The kernel then judges all
/// of its memory at that cgroup's limit; a process moved in after it started would leave what
/// it touched before outside (cgroup v1 keeps pages charged where they were first touched).
pub fn join_command(dir: &Path, program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
        .arg(dir)
        .arg(program);
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oom_kill_line_is_read_from_v1_and_v2_files() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed_number(v1, "oom_kill"), Some(3));
        assert_eq!(keyed_number(v2, "oom_kill"), Some(2));
        assert_eq!(keyed_number("oom_kill_disable 0\n", "oom_kill"), None);
    }

    #[test]
    fn the_joining_command_becomes_the_program_in_the_group() {
        let command = join_command(Path::new("/sys/fs/cgroup/memory/x"), "/bin/true");
        let args: Vec<&OsStr> = command.get_args().collect();
        assert_eq!(command.get_program(), "sh");
        assert_eq!(args[2], "/sys/fs/cgroup/memory/x");
        assert_eq!(args[3], "/bin/true");
        assert!(args[1].to_string_lossy().ends_with(r#"exec "$@""#));
    }

    #[test]
    fn a_group_holds_what_it_started_and_is_removed_with_it() {
        if !crate::skip::running_as_root() {
            crate::skip::skip("making a cgroup needs root");
            return;
        }
        let group = match MemoryCgroup::create("flagd-proxy-testkit", 64 << 20) {
            Ok(group) => group,
            Err(CgroupError::NoHierarchy) => {
                crate::skip::skip("no memory cgroup hierarchy");
                return;
            }
            Err(error) => panic!("{error}"),
        };
        let dir = group.dir().to_path_buf();
        // The program says when it runs, which is after the group took it in: no waiting.
        let mut child = group
            .command("sh")
            .args(["-c", "echo running && exec sleep 600"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn sleep");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("read");
        assert_eq!(line, "running\n");
        assert!(
            group.pids().expect("pids").contains(&child.id()),
            "sleep is not in {dir:?}"
        );
        assert_eq!(group.oom_kills().expect("oom_kill"), 0);
        assert!(group.peak_bytes().expect("peak") > 0);
        drop(group);
        assert!(!dir.exists(), "{dir:?} left behind");
        assert!(
            !child.wait().expect("wait").success(),
            "sleep was not killed"
        );
    }
}
