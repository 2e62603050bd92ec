//! What a test does when something it needs is missing (a tool, test data, root): under `CI` it
//! fails with the reason, elsewhere it is skipped — and skipped visibly. Such a test is
//! `#[ignore = "needs …"]`, so a plain `cargo test` lists it as ignored, and `scripts/test` runs
//! it (`--include-ignored`). `cargo test` hides the output of a passing test, so a skip is also
//! written to `target/skipped-tests.log`, which `scripts/test` prints at the end of the run.

use std::fmt::Display;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Whether the tests run in CI (`CI` set), where nothing a test needs may be missing.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// Whether this process runs as root (network namespaces, mounts, cgroups need it).
pub fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// The file skips are recorded in: `target/skipped-tests.log`.
pub fn log_path() -> PathBuf {
    crate::profile_dir()
        .parent()
        .map(|target| target.join("skipped-tests.log"))
        .unwrap_or_else(|| PathBuf::from("skipped-tests.log"))
}

/// The calling test cannot run because of `reason` (what is missing and how to get it): panics
/// under `CI`; otherwise records the skip and returns, and the caller returns too.
pub fn skip(reason: impl Display) {
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    record(in_ci(), &log_path(), &test, &reason.to_string());
}

/// The calling test cannot run because an optional peer binary is absent: one that no registry
/// serves, so no installer can provide it, and that the `shared/bin` folder beside the repository
/// holds where it is present. Recorded and skipped under `CI` too: a plain clone passes without
/// the peers.
pub fn skip_without_peer(reason: impl Display) {
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    record(false, &log_path(), &test, &reason.to_string());
}

fn record(in_ci: bool, log: &Path, test: &str, reason: &str) {
    if in_ci {
        panic!("{test} cannot run: {reason}");
    }
    eprintln!("SKIPPED {test}: {reason}");
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut file| file.write_all(format!("{test}: {reason}\n").as_bytes()));
    if let Err(error) = appended {
        eprintln!("could not record the skip in {}: {error}", log.display());
    }
}

/// The value in `found`, an `Option` from a function that records a skip when it gives `None`
/// (such as [`require`]), or else a return from the calling test:
/// `let helm = or_return!(ChartRenderer::find_or_skip());`.
#[macro_export]
macro_rules! or_return {
    ($found:expr) => {
        match $found {
            Some(value) => value,
            None => return,
        }
    };
}

/// `found`, or (with its error as the reason) [`skip`] and `None`.
pub fn require<T, E: Display>(found: Result<T, E>) -> Option<T> {
    match found {
        Ok(value) => Some(value),
        Err(reason) => {
            skip(reason);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_recorded_outside_ci_and_fails_under_ci() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("skipped.log");
        record(false, &log, "one", "helm is missing");
        record(false, &log, "two", "no root");
        let lines = std::fs::read_to_string(&log).expect("the log");
        assert_eq!(lines, "one: helm is missing\ntwo: no root\n");
        let under_ci = std::panic::catch_unwind(|| record(true, &log, "three", "gone"));
        assert!(
            under_ci.is_err(),
            "under CI a missing dependency fails the test"
        );
        assert_eq!(std::fs::read_to_string(&log).expect("the log"), lines);
    }
}
