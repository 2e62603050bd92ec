//! The cluster's teardown (`flagd_proxy_testkit::cluster::remove_all`, which every cluster run
//! ends with and starts with, and `flagd-proxy-cluster down` runs) touches only what the cluster
//! made. On a machine that is itself a Kubernetes node, processes
//! in `kubepods` cgroups and `cni-*` network namespaces are that node's pods: they must survive.
//!
//! The test puts a decoy process in a `kubepods` cgroup of every hierarchy and makes a decoy
//! `cni-*` network namespace holding only loopback (what a leftover pod namespace looks like),
//! runs the teardown, and checks both are still there. It holds the machine-wide cluster lock
//! meanwhile, so no cluster is up while it runs; it removes its decoys however it ends. Needs
//! root: without it the test prints a notice and passes, unless `CI` is set.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use flagd_proxy_testkit as support;
use support::cluster::layout::{Layout, MachineLock};

/// What the test made, removed on drop (also after a panic).
struct Decoys {
    process: Child,
    /// Cgroups made for the decoy, deepest first (with their `kubepods` parent when the test
    /// made that too).
    cgroups: Vec<PathBuf>,
    netns: String,
}

impl Drop for Decoys {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        for cgroup in &self.cgroups {
            let _ = std::fs::remove_dir(cgroup);
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

fn is_root() -> bool {
    support::skip::running_as_root()
}

/// The cgroup v1 hierarchies (or the v2 one) mounted on this machine.
fn cgroup_mounts() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").expect("read /proc/mounts");
    mounts
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                [_, path, "cgroup" | "cgroup2", ..] => Some(PathBuf::from(path)),
                _ => None,
            }
        })
        .collect()
}

fn run(command: &mut Command) {
    let output = command.output().expect("run a command");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A `sleep` in `kubepods/<name>` of every hierarchy, and the netns `cni-<name>`.
fn make_decoys(name: &str) -> Decoys {
    let process = Command::new("sleep")
        .arg("600")
        .stdin(Stdio::null())
        .spawn()
        .expect("start the decoy process");
    let netns = format!("cni-{name}");
    let mut decoys = Decoys {
        process,
        cgroups: Vec::new(),
        netns: netns.clone(),
    };
    for mount in cgroup_mounts() {
        let kubepods = mount.join("kubepods");
        let made_kubepods = !kubepods.exists();
        let cgroup = kubepods.join(name);
        if std::fs::create_dir_all(&cgroup).is_err() {
            continue;
        }
        decoys.cgroups.push(cgroup.clone());
        if made_kubepods {
            decoys.cgroups.push(kubepods.clone());
        }
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if cgroup.join(file).exists() {
                let from_parent = std::fs::read_to_string(mount.join(file)).unwrap_or_default();
                let _ = std::fs::write(kubepods.join(file), &from_parent);
                let _ = std::fs::write(cgroup.join(file), &from_parent);
            }
        }
        let procs = cgroup.join("cgroup.procs");
        std::fs::write(&procs, decoys.process.id().to_string())
            .unwrap_or_else(|e| panic!("move the decoy into {}: {e}", procs.display()));
    }
    assert!(
        !decoys.cgroups.is_empty(),
        "no cgroup hierarchy took the decoy"
    );
    run(Command::new("ip").args(["netns", "add", &netns]));
    decoys
}

fn alive(process: &mut Child) -> bool {
    matches!(process.try_wait(), Ok(None))
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

#[test]
#[ignore = "needs root: run scripts/test as root"]
fn teardown_leaves_other_pods_processes_and_network_namespaces_alone() {
    if !is_root() {
        support::skip::skip("the cluster teardown test needs root");
        return;
    }
    let name = format!("flagd-proxy-decoy-{}", std::process::id());
    let mut decoys = make_decoys(&name);
    // No cluster may be up while the teardown runs: it runs under the machine-wide lock.
    let lock = MachineLock::acquire(|| eprintln!("waiting for the cluster on this machine to end"))
        .expect("take the machine-wide cluster lock");
    support::cluster::remove_all(&Layout::from_env());
    drop(lock);
    assert!(
        alive(&mut decoys.process),
        "the teardown killed a process in a kubepods cgroup it did not make"
    );
    for cgroup in &decoys.cgroups {
        assert!(
            cgroup.is_dir(),
            "the teardown removed the cgroup {}",
            cgroup.display()
        );
    }
    assert!(
        netns_exists(&decoys.netns),
        "the teardown deleted the network namespace {}",
        decoys.netns
    );
}
