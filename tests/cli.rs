//! The binary's exit status and messages for `--config`.
use std::process::{Command, Output};

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flagd-proxy"))
        .args(args)
        .env_remove("FLAGD_PROXY_CONFIG")
        .output()
        .expect("run flagd-proxy")
}

fn config_file(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("create a temporary file");
    std::fs::write(file.path(), text).expect("write the config file");
    file
}

#[test]
fn config_file_errors_exit_64_with_one_message() {
    for (text, expected) in [
        (
            "prot: 9000\n",
            "key `prot` is not a flag of `flagd-proxy start` (did you mean `port`?)",
        ),
        (
            "port: abc\n",
            "key `port`: invalid value 'abc' for '--port <PORT>'",
        ),
    ] {
        let file = config_file(text);
        let output = run(&[
            "start".as_ref(),
            "--config".as_ref(),
            file.path().as_os_str(),
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{stderr}");
        assert!(
            stderr.starts_with(&format!(
                "flagd-proxy: config file {}: ",
                file.path().display()
            )),
            "{stderr}"
        );
        assert!(stderr.contains(expected), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

#[test]
fn help_with_a_config_file_exits_0() {
    let output = run(&[
        "--config".as_ref(),
        "/nonexistent/flagd-proxy.yaml".as_ref(),
        "start".as_ref(),
        "--help".as_ref(),
    ]);
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("--keep-alive-permit-without-stream"),
        "{stdout}"
    );
}
