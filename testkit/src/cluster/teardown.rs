//! The machine-wide state a cluster makes, and its removal: the network namespace, the cgroup
//! root in every hierarchy, the mounts kubelet and containerd make, the kernel settings kubelet
//! changes.
//!
//! [`remove_all`] touches only what the cluster made: the processes in its network namespace,
//! the processes in its own cgroup root ([`CGROUP_ROOT`], in each hierarchy), the mounts under its
//! own directories (pod network namespaces are mounted under the run directory too) and its
//! namespace. Nothing is found by a name pattern another program could share (`kubepods`,
//! `cni-*`). It is idempotent and safe when nothing, or half of it, is there.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::layout::{Layout, log};
use super::names::{CGROUP_ROOT, NETNS, netns_path};

/// Kernel settings kubelet changes machine-wide; put back by [`remove_all`].
const KUBELET_SYSCTLS: [&str; 3] = [
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
];
/// How long processes get to end after SIGTERM before they are killed.
const GRACE: Duration = Duration::from_secs(10);

/// Removes everything a cluster (running, or left by a run that was killed) made on this machine.
pub fn remove_all(layout: &Layout) {
    let netns = netns_path();
    signal(&netns_pids(&netns), "TERM");
    // Container processes live in pod namespaces; the cluster's cgroup root holds exactly them.
    signal(&cgroup_pids(), "KILL");
    let deadline = Instant::now() + GRACE;
    while !netns_pids(&netns).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    signal(&netns_pids(&netns), "KILL");
    signal(&cgroup_pids(), "KILL");
    unmount_under(&[&layout.state, &layout.run]);
    if netns.exists() {
        quiet(Command::new("ip").args(["netns", "del", NETNS]));
    }
    for root in cgroup_roots() {
        remove_dirs_deepest_first(&root);
    }
    restore_sysctls(&layout.sysctls());
    // The logs of the last cluster stay for a post-mortem.
    let logs = layout.logs();
    if logs.is_dir() {
        let kept = layout.kept_logs();
        let _ = fs::remove_dir_all(&kept);
        if let Err(error) = fs::rename(&logs, &kept) {
            log(format_args!("keeping {}: {error}", logs.display()));
        }
    }
    for dir in [&layout.state, &layout.run] {
        if let Err(error) = fs::remove_dir_all(dir)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            log(format_args!("removing {}: {error}", dir.display()));
        }
    }
}

/// The processes whose network namespace is the one mounted at `netns`.
fn netns_pids(netns: &Path) -> Vec<u32> {
    let Ok(inode) = fs::metadata(netns).map(|m| m.ino()) else {
        return Vec::new();
    };
    let wanted = format!("net:[{inode}]");
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != std::process::id())
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|link| link.as_os_str() == wanted.as_str())
        })
        .collect()
}

fn signal(pids: &[u32], signal: &str) {
    if pids.is_empty() {
        return;
    }
    quiet(
        Command::new("kill")
            .arg(format!("-{signal}"))
            .args(pids.iter().map(u32::to_string)),
    );
}

/// Runs a command whose failure changes nothing (what it removes may be gone already).
fn quiet(command: &mut Command) {
    let _ = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The cluster's cgroup root in each mounted cgroup hierarchy (v1: one per controller; v2: one).
pub(crate) fn cgroup_roots() -> BTreeSet<PathBuf> {
    mounts()
        .into_iter()
        .filter(|(_, fs_type)| fs_type == "cgroup" || fs_type == "cgroup2")
        .map(|(point, _)| point.join(CGROUP_ROOT))
        .collect()
}

/// Creates the cluster's cgroup root in every hierarchy (kubelet requires it to exist).
pub(crate) fn make_cgroup_roots() -> std::io::Result<()> {
    for root in cgroup_roots() {
        fs::create_dir_all(&root)?;
        // A v1 cpuset cgroup takes no process until it has CPUs and memory nodes of its own.
        let cpus = root.join("cpuset.cpus");
        if cpus.exists() && fs::read_to_string(&cpus)?.trim().is_empty() {
            let parent = root.parent().unwrap_or(&root);
            for file in ["cpuset.cpus", "cpuset.mems"] {
                fs::write(root.join(file), fs::read_to_string(parent.join(file))?)?;
            }
        }
    }
    Ok(())
}

/// Every process in a cgroup under the cluster's cgroup roots.
fn cgroup_pids() -> Vec<u32> {
    let mut pids = BTreeSet::new();
    for root in cgroup_roots() {
        for dir in dirs_deepest_first(&root) {
            // Cgroups go away while they are read (their processes die): skip those.
            let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
    }
    pids.into_iter().collect()
}

/// `dir` and every directory below it, children before their parents.
fn dirs_deepest_first(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                found.extend(dirs_deepest_first(&entry.path()));
            }
        }
    }
    if dir.is_dir() {
        found.push(dir.to_path_buf());
    }
    found
}

fn remove_dirs_deepest_first(root: &Path) {
    for dir in dirs_deepest_first(root) {
        // A cgroup directory is removed with rmdir, with its control files in it.
        let _ = fs::remove_dir(&dir);
    }
}

/// The mount points and file system types of /proc/mounts.
fn mounts() -> Vec<(PathBuf, String)> {
    fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let point = fields.nth(1)?.replace("\\040", " ");
            Some((PathBuf::from(point), fields.next()?.to_owned()))
        })
        .collect()
}

/// Unmounts everything mounted under `dirs`, deepest first (lazily when busy); mounts stacked on
/// one another take more than one pass.
fn unmount_under(dirs: &[&Path]) {
    for _ in 0..3 {
        let mut points: Vec<PathBuf> = mounts()
            .into_iter()
            .map(|(point, _)| point)
            .filter(|point| dirs.iter().any(|dir| point.starts_with(dir)))
            .collect();
        if points.is_empty() {
            return;
        }
        points.sort();
        for point in points.iter().rev() {
            let unmounted = Command::new("umount")
                .arg(point)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !unmounted {
                quiet(Command::new("umount").arg("-l").arg(point));
            }
        }
    }
}

/// Saves the kernel settings kubelet changes to `file`, one `name=value` a line.
pub(crate) fn save_sysctls(file: &Path) -> std::io::Result<()> {
    let mut saved = String::new();
    for name in KUBELET_SYSCTLS {
        let value = fs::read_to_string(Path::new("/proc/sys").join(name))?;
        saved.push_str(&format!("{name}={}\n", value.trim()));
    }
    fs::write(file, saved)
}

/// Puts back the kernel settings [`save_sysctls`] saved, if it did.
fn restore_sysctls(file: &Path) {
    let Ok(saved) = fs::read_to_string(file) else {
        return;
    };
    for line in saved.lines() {
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let name = name.trim().replace('.', "/");
        let value = value.trim();
        if !KUBELET_SYSCTLS.contains(&name.as_str()) {
            continue;
        }
        if let Err(error) = fs::write(Path::new("/proc/sys").join(&name), value) {
            log(format_args!("restoring {name}={value}: {error}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deeper_directories_come_before_their_parents() {
        let root = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(root.path().join("a/b/c")).expect("mkdir");
        fs::create_dir_all(root.path().join("d")).expect("mkdir");
        let dirs = dirs_deepest_first(root.path());
        let position = |p: &str| {
            let path = if p.is_empty() {
                root.path().to_path_buf()
            } else {
                root.path().join(p)
            };
            dirs.iter()
                .position(|d| *d == path)
                .unwrap_or_else(|| panic!("{} not listed in {dirs:?}", path.display()))
        };
        assert_eq!(dirs.len(), 5);
        assert!(position("a/b/c") < position("a/b"));
        assert!(position("a/b") < position("a"));
        assert!(position("a") < position(""));
        assert!(position("d") < position(""));
    }
}
