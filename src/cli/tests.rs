//! Tests of the command line: parsing, the config file, defaults, and the generated reference.
use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

use super::*;

/// A config file with the given extension and text, removed when dropped.
fn config_file(extension: &str, text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new()
        .suffix(&format!(".{extension}"))
        .tempfile()
        .expect("create a temporary file");
    std::io::Write::write_all(&mut file, text.as_bytes()).expect("write the config file");
    file
}

fn parse(args: &[&OsStr]) -> Result<Cli, CliError> {
    parse_from(std::iter::once(OsStr::new("flagd-proxy")).chain(args.iter().copied()))
}

fn start_args(cli: Cli) -> StartArgs {
    let Command::Start(args) = cli.command else {
        panic!("expected start")
    };
    *args
}

/// `start --config <file> <extra...>` with a file holding `text`.
fn start_with_config(extension: &str, text: &str, extra: &[&str]) -> Result<StartArgs, String> {
    let file = config_file(extension, text);
    let mut args = vec![
        OsStr::new("start"),
        OsStr::new("--config"),
        file.path().as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    parse(&args).map(start_args).map_err(|error| {
        let message = error.to_string();
        assert!(
            message.contains(&file.path().display().to_string()),
            "the message names the file: {message}"
        );
        message
    })
}

#[test]
fn go_proxy_compatibility_flags_parse() {
    let args = |line: &[&str]| {
        start_args(
            Cli::try_parse_from(std::iter::once("flagd-proxy").chain(line.iter().copied()))
                .expect("parses"),
        )
    };
    assert_eq!(
        args(&["start", "--metrics-port", "9100"])
            .serve
            .management_port,
        9100
    );
    assert_eq!(
        args(&["start", "--metrics-port=9100"])
            .serve
            .management_port,
        9100
    );
    let given = args(&[
        "start",
        "--keep-alive-min-time",
        "10s",
        "--keep-alive-permit-without-stream=false",
    ]);
    assert_eq!(
        (
            given.server.keep_alive_min_time,
            given.server.keep_alive_permit_without_stream
        ),
        (Duration::from_secs(10), false)
    );
    let bare = args(&["start", "--keep-alive-permit-without-stream", "-p", "9000"]);
    assert!(bare.server.keep_alive_permit_without_stream);
    assert_eq!(bare.serve.port, 9000);
    let defaults = args(&["start"]);
    assert_eq!(
        (
            defaults.server.keep_alive_min_time,
            defaults.server.keep_alive_permit_without_stream
        ),
        (Duration::from_secs(30), true)
    );
    // As with a Go boolean flag, a value needs `=`.
    assert!(
        Cli::try_parse_from([
            "flagd-proxy",
            "start",
            "--keep-alive-permit-without-stream",
            "false"
        ])
        .is_err()
    );
}

#[test]
fn config_flag_is_accepted_before_and_after_start() {
    let file = config_file("yaml", "port: 9000\n");
    let path = file.path().as_os_str();
    for line in [
        vec![OsStr::new("--config"), path, OsStr::new("start")],
        vec![OsStr::new("start"), OsStr::new("--config"), path],
        vec![
            OsStr::new("start"),
            OsStr::new("--config"),
            path,
            OsStr::new("--"),
        ],
    ] {
        let cli = parse(&line).expect("parses");
        assert_eq!(cli.config.as_deref(), Some(file.path()), "{line:?}");
        assert_eq!(start_args(cli).serve.port, 9000, "{line:?}");
    }
}

#[test]
fn config_file_values_apply() {
    let args = start_with_config(
        "yaml",
        "# flagd-proxy\n\
         port: 9000\n\
         management-port: 9001\n\
         log-format: json\n\
         debug: true\n\
         manifests: [a, b]\n\
         keepalive-interval: 10s\n\
         max-watches: 5\n\
         keep-alive-min-time: 1m\n\
         keep-alive-permit-without-stream: false\n\
         compression: off\n\
         compression-min-bytes: 1000\n",
        &[],
    )
    .expect("parses");
    // `off` is the word, not YAML 1.1's boolean.
    assert_eq!(
        args.sync.compression_settings(),
        crate::wire::CompressionSettings {
            mode: crate::wire::CompressionMode::Off,
            min_bytes: 1000,
            level: crate::wire::compression::DEFAULT_LEVEL,
        }
    );
    assert_eq!(
        (
            args.serve.port,
            args.serve.management_port,
            args.log.log_format,
            args.log.debug
        ),
        (9000, 9001, LogFormat::Json, true)
    );
    assert_eq!(
        args.source.manifests,
        [PathBuf::from("a"), PathBuf::from("b")]
    );
    assert_eq!(args.server.keepalive_interval, Duration::from_secs(10));
    assert_eq!(args.hub.max_watches, 5);
    assert_eq!(args.server.keep_alive_min_time, Duration::from_secs(60));
    assert!(!args.server.keep_alive_permit_without_stream);
}

#[test]
fn json_config_file_values_apply() {
    let args = start_with_config(
        "json",
        r#"{"port": 9000, "metrics-port": 9100, "manifests": ["a", "b"], "upstream-tls": false}"#,
        &[],
    )
    .expect("parses");
    assert_eq!((args.serve.port, args.serve.management_port), (9000, 9100));
    assert_eq!(
        args.source.manifests,
        [PathBuf::from("a"), PathBuf::from("b")]
    );
    assert!(!args.source.upstream_tls);
}

#[test]
fn config_file_details() {
    // Keys are case-insensitive; a single value for a repeatable flag; an empty file.
    let args = start_with_config("yml", "Port: 9000\nmanifests: a\n", &[]).expect("parses");
    assert_eq!(args.serve.port, 9000);
    assert_eq!(args.source.manifests, [PathBuf::from("a")]);
    let args = start_with_config("yaml", "# nothing yet\n", &[]).expect("parses");
    assert_eq!((args.serve.port, args.serve.management_port), (8015, 8016));
    // A file without an extension is YAML.
    let args = start_with_config("", "port: 9000\n", &[]).expect("parses");
    assert_eq!(args.serve.port, 9000);
}

#[test]
fn command_line_beats_config_file() {
    let text = "port: 9000\nmanagement-port: 9001\nmanifests: [a, b]\nlog-format: json\n";
    let args =
        start_with_config("yaml", text, &["-p", "7000", "--manifests", "c"]).expect("parses");
    assert_eq!((args.serve.port, args.serve.management_port), (7000, 9001));
    assert_eq!(args.source.manifests, [PathBuf::from("c")]);
    assert_eq!(args.log.log_format, LogFormat::Json);
    // The Go name counts as the command line too.
    let args = start_with_config("yaml", text, &["--metrics-port", "7001"]).expect("parses");
    assert_eq!((args.serve.port, args.serve.management_port), (9000, 7001));
}

/// Runs in a child process of the test binary, so that no test changes the environment of
/// the process the other tests run in.
#[test]
fn environment_beats_config_file() {
    const CHILD: &str = "FLAGD_PROXY_TEST_ENVIRONMENT_CHILD";
    if std::env::var_os(CHILD).is_some() {
        // The config file comes through FLAGD_PROXY_CONFIG, the port through FLAGD_PROXY_PORT.
        let args = start_args(parse(&[OsStr::new("start")]).expect("parses"));
        assert_eq!((args.serve.port, args.serve.management_port), (7000, 9001));
        let args = start_args(
            parse(&[OsStr::new("start"), OsStr::new("-p"), OsStr::new("6000")]).expect("parses"),
        );
        assert_eq!((args.serve.port, args.serve.management_port), (6000, 9001));
        return;
    }
    let file = config_file("yaml", "port: 9000\nmanagement-port: 9001\n");
    let name = module_path!()
        .split_once("::")
        .map_or(module_path!(), |(_, path)| path);
    let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            &format!("{name}::environment_beats_config_file"),
            "--exact",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("FLAGD_PROXY_CONFIG", file.path())
        .env("FLAGD_PROXY_PORT", "7000")
        .output()
        .expect("run the test binary");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn config_file_completes_what_the_command_line_requires() {
    let args = start_with_config(
        "yaml",
        "server-key-path: key.pem\n",
        &["--server-cert-path", "cert.pem"],
    )
    .expect("parses");
    assert_eq!(args.tls.server_key_path, Some(PathBuf::from("key.pem")));
    // Without it, the parser's own error, not one about the file.
    let error = parse_from(["flagd-proxy", "start", "--server-cert-path", "cert.pem"])
        .expect_err("refused");
    assert!(
        matches!(error, CliError::Clap(ref e) if e.kind() == ErrorKind::MissingRequiredArgument)
    );
    let file = config_file("yaml", "port: 9000\n");
    let error = parse(&[
        OsStr::new("start"),
        OsStr::new("--config"),
        file.path().as_os_str(),
        OsStr::new("--server-cert-path"),
        OsStr::new("cert.pem"),
    ])
    .expect_err("refused");
    assert!(
        matches!(error, CliError::Clap(ref e) if e.kind() == ErrorKind::MissingRequiredArgument)
    );
}

#[test]
fn config_file_is_only_read_for_start() {
    let missing = OsStr::new("/nonexistent/flagd-proxy.yaml");
    let cli = parse(&[
        OsStr::new("--config"),
        missing,
        OsStr::new("generate-cli-docs"),
    ])
    .expect("parses");
    assert!(matches!(cli.command, Command::GenerateCliDocs));
    // Help comes before the file.
    let error = parse(&[
        OsStr::new("start"),
        OsStr::new("--help"),
        OsStr::new("--config"),
        missing,
    ])
    .expect_err("help");
    assert!(matches!(error, CliError::Clap(ref e) if !e.use_stderr()));
}

#[test]
fn config_file_errors_name_the_file_and_key() {
    let error = |extension: &str, text: &str, extra: &[&str]| {
        start_with_config(extension, text, extra).expect_err("refused")
    };
    let cases: &[(&str, &str, &[&str], &[&str])] = &[
        (
            "yaml",
            "- port\n- 9000\n",
            &[],
            &["expected a mapping", "found a list"],
        ),
        (
            "yaml",
            "9000\n",
            &[],
            &["expected a mapping", "found a number"],
        ),
        (
            "yaml",
            "prot: 9000\n",
            &[],
            &[
                "key `prot` is not a flag of `flagd-proxy start`",
                "did you mean `port`?",
            ],
        ),
        (
            "yaml",
            "management_port: 9000\n",
            &[],
            &["key `management_port`", "did you mean `management-port`?"],
        ),
        (
            "yaml",
            "nothing-like-it: 1\n",
            &[],
            &["key `nothing-like-it` is not a flag"],
        ),
        (
            "yaml",
            "config: other.yaml\n",
            &[],
            &["key `config` cannot be set"],
        ),
        ("yaml", "help: true\n", &[], &["key `help` cannot be set"]),
        (
            "yaml",
            "version: 1\n",
            &[],
            &["key `version` cannot be set"],
        ),
        (
            "yaml",
            "port:\n  value: 9000\n",
            &[],
            &["key `port`", "found a nested mapping"],
        ),
        (
            "yaml",
            "manifests: [a, {b: c}]\n",
            &[],
            &["key `manifests`", "found a nested mapping"],
        ),
        (
            "yaml",
            "port: [9000, 9001]\n",
            &[],
            &["key `port`", "--port takes a single value, not a list"],
        ),
        ("yaml", "port:\n", &[], &["key `port`", "no value"]),
        (
            "yaml",
            "debug: 1\n",
            &[],
            &["key `debug`", "expected true or false"],
        ),
        (
            "yaml",
            "management-port: 1\nmetrics-port: 2\n",
            &[],
            &["keys `management-port` and `metrics-port` both set --management-port"],
        ),
        (
            "yaml",
            "port: 9000\n  bad: indentation\n",
            &[],
            &["not valid YAML"],
        ),
        ("json", "{\"port\": 9000,}", &[], &["not valid JSON"]),
        (
            "toml",
            "port = 9000\n",
            &[],
            &["unsupported format `.toml`"],
        ),
        (
            "yaml",
            "port: abc\n",
            &[],
            &["key `port`: invalid value 'abc' for '--port <PORT>'"],
        ),
        (
            "yaml",
            "port: 70000\n",
            &[],
            &["key `port`: invalid value '70000' for '--port <PORT>'"],
        ),
        (
            "yaml",
            "log-format: xml\n",
            &[],
            &["key `log-format`: invalid value 'xml'"],
        ),
        (
            "yaml",
            "keep-alive-min-time: 10\n",
            &[],
            &["key `keep-alive-min-time`: invalid value '10'"],
        ),
        (
            "yaml",
            "upstream: proxy:8015\n",
            &["--manifests", "d"],
            &["key `upstream`:", "cannot be used with"],
        ),
    ];
    for (extension, text, extra, expected) in cases {
        let message = error(extension, text, extra);
        for part in *expected {
            assert!(
                message.contains(part),
                "{text:?}: {message:?} lacks {part:?}"
            );
        }
        assert!(!message.contains('\n'), "one line: {message:?}");
    }
    let missing = parse(&[
        OsStr::new("start"),
        OsStr::new("--config"),
        OsStr::new("/nonexistent/flagd-proxy.yaml"),
    ])
    .expect_err("refused")
    .to_string();
    assert!(
        missing.starts_with("config file /nonexistent/flagd-proxy.yaml: cannot read it"),
        "{missing}"
    );
}

#[test]
fn definitions_are_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn go_proxy_command_lines_parse() {
    let cli = Cli::try_parse_from([
        "flagd-proxy",
        "start",
        "--management-port",
        "8016",
        "--debug",
    ])
    .expect("parses");
    let Command::Start(args) = cli.command else {
        panic!("start")
    };
    assert_eq!(
        (args.serve.port, args.serve.management_port, args.log.debug),
        (8015, 8016, true)
    );
    let cli = Cli::try_parse_from([
        "flagd-proxy",
        "start",
        "-p",
        "9000",
        "-m",
        "9001",
        "-z",
        "json",
        "-x",
    ])
    .expect("parses");
    let Command::Start(args) = cli.command else {
        panic!("start")
    };
    assert_eq!(
        (
            args.serve.port,
            args.serve.management_port,
            args.log.log_format
        ),
        (9000, 9001, LogFormat::Json)
    );
}

#[test]
fn docs_match_the_definitions() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.md");
    let generated = markdown();
    if std::env::var_os("FLAGD_PROXY_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &generated).expect("write docs/cli.md");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/cli.md is out of date: run `cargo run -- generate-cli-docs > docs/cli.md` (or FLAGD_PROXY_UPDATE_DOCS=1 cargo test)"
    );
}

/// Each group of `start` flags, parsed from an empty command line, gives its component's
/// `Default`: a default is written once, beside the component's settings, and both use it.
#[test]
fn empty_command_line_gives_every_components_default() {
    use crate::authz::AuthzSettings;
    use crate::hub::HubOptions;
    use crate::management::ManagementOptions;
    use crate::server::ServerOptions;
    use crate::settings::{ServeSettings, SourceSettings};

    let args = start_args(Cli::try_parse_from(["flagd-proxy", "start"]).expect("parses"));
    assert_eq!(ServeSettings::from(args.serve), ServeSettings::default());
    assert_eq!(
        format!("{:?}", SourceSettings::from(args.source)),
        format!("{:?}", SourceSettings::default())
    );
    assert!(args.tls.into_settings().is_none());
    assert_eq!(AuthzSettings::from(args.authz), AuthzSettings::default());
    assert_eq!(HubOptions::from(args.hub), HubOptions::default());
    assert_eq!(
        crate::settings::MemorySettings::from(args.memory),
        crate::settings::MemorySettings::default()
    );
    assert_eq!(
        args.sync.compression_settings(),
        crate::wire::CompressionSettings::default()
    );
    assert!(args.sync.context_values.is_empty());
    let server = ServerOptions::from(args.server);
    assert_eq!(server, ServerOptions::default());
    assert_eq!(
        args.management.into_settings(&server),
        ManagementOptions::default()
    );
    assert_eq!(
        args.otlp.otlp_interval,
        crate::telemetry::OtlpSettings::default().interval
    );
    assert!(
        args.otlp.into_settings(None).is_none(),
        "OTLP is off by default"
    );
    // And all of them together.
    let settings = crate::settings::Settings::from(start_args(
        Cli::try_parse_from(["flagd-proxy", "start"]).expect("parses"),
    ));
    assert_eq!(
        format!("{settings:?}"),
        format!("{:?}", crate::settings::Settings::default())
    );
}

/// Flags land in the settings of their component.
#[test]
fn flags_become_component_settings() {
    use crate::settings::{Settings, SourceSettings};

    let settings = |line: &[&str]| {
        Settings::from(start_args(
            Cli::try_parse_from(["flagd-proxy", "start"].iter().chain(line)).expect("parses"),
        ))
    };
    let given = settings(&[
        "--handshake-timeout=3s",
        "--keepalive-interval=7s",
        "--max-connection-age=5m",
        "--max-management-connections=9",
        "--max-document-bytes=100",
        "--authz=namespace",
        "--authz-allow-namespaces=a,b",
        "--upstream=proxy:8015",
        "--upstream-tls",
        "--server-cert-path=cert.pem",
        "--server-key-path=key.pem",
        "--context-value=region=eu",
        "--sync-socket-path=/run/flagd.sock",
        "--sync-socket-mode=0600",
        "--compression=off",
        "--compression-min-bytes=1000",
        "--compression-level=1",
    ]);
    assert_eq!(
        given.compression,
        crate::wire::CompressionSettings {
            mode: crate::wire::CompressionMode::Off,
            min_bytes: 1000,
            level: 1,
        }
    );
    assert_eq!(
        settings_summary(&given),
        "3s 7s 7s Some((300s, 10s)) 9 100 Namespace [\"a\", \"b\"] cert.pem \
         [(\"region\", \"eu\")] Some(\"/run/flagd.sock\") 0o600"
    );
    let SourceSettings::Upstream {
        settings: upstream, ..
    } = &given.source
    else {
        panic!("expected the upstream source: {:?}", given.source)
    };
    assert_eq!(
        (upstream.address.as_str(), upstream.tls),
        ("proxy:8015", true)
    );
    // Manifests come before the Kubernetes API; --events=false reaches the Kubernetes source.
    let manifests = settings(&["--manifests=a", "--kube-api-server=https://api:6443"]);
    assert!(
        matches!(manifests.source, SourceSettings::Manifests(ref dirs) if dirs == &[PathBuf::from("a")])
    );
    let kubernetes = settings(&["--kube-api-server=https://api:6443", "--events=false"]);
    assert!(matches!(
        kubernetes.source,
        SourceSettings::Kubernetes { ref settings, events: false }
            if settings.api_server.as_deref() == Some("https://api:6443")
    ));
    let otlp = settings(&[
        "--otlp-endpoint=https://collector:4317",
        "--otlp-header=x-api-key=secret",
        "--otlp-header=x-tenant=a=b",
        "--otlp-ca-file=ca.pem",
        "--otlp-interval=5s",
        "--otlp-resource-attribute=deployment.environment=prod",
        "--pod-name=flagd-proxy-7",
    ]);
    assert_eq!(otlp.serve.pod_name.as_deref(), Some("flagd-proxy-7"));
    assert_eq!(
        otlp.otlp,
        Some(crate::telemetry::OtlpSettings {
            endpoint: "https://collector:4317".into(),
            headers: vec![
                ("x-api-key".into(), "secret".into()),
                ("x-tenant".into(), "a=b".into())
            ],
            ca_file: Some("ca.pem".into()),
            interval: Duration::from_secs(5),
            resource_attributes: vec![("deployment.environment".into(), "prod".into())],
            instance: Some("flagd-proxy-7".into()),
        })
    );
    // The other OTLP flags mean nothing without an endpoint.
    assert!(Cli::try_parse_from(["flagd-proxy", "start", "--otlp-header=a=b"]).is_err());
}

/// `--max-resources-per-address` is 100 on a node tier unless given and no limit elsewhere;
/// the config file sets it like any flag; `--upstream-streams-per-connection` reaches the
/// upstream's settings, at least 1.
#[test]
fn resources_per_address_and_streams_per_upstream_connection() {
    use crate::settings::{Settings, SourceSettings};
    use crate::source::upstream::DEFAULT_STREAMS_PER_CONNECTION;

    let settings = |line: &[&str]| {
        Settings::from(start_args(
            Cli::try_parse_from(["flagd-proxy", "start"].iter().chain(line)).expect("parses"),
        ))
    };
    let per_address = |line: &[&str]| settings(line).server.max_resources_per_address;
    assert_eq!(per_address(&["--upstream=central:8015"]), 100);
    assert_eq!(per_address(&[]), 0, "no limit on a central proxy");
    assert_eq!(per_address(&["--manifests=a"]), 0);
    assert_eq!(
        per_address(&["--upstream=central:8015", "--max-resources-per-address=0"]),
        0
    );
    assert_eq!(per_address(&["--max-resources-per-address=7"]), 7);
    let args = start_with_config(
        "yaml",
        "upstream: central:8015\nmax-resources-per-address: 12\nupstream-streams-per-connection: 40\n",
        &[],
    )
    .expect("parses");
    let from_file = Settings::from(args);
    assert_eq!(from_file.server.max_resources_per_address, 12);
    let streams_per_connection = |settings: Settings| match settings.source {
        SourceSettings::Upstream { settings, .. } => settings.streams_per_connection,
        other => panic!("expected the upstream source: {other:?}"),
    };
    assert_eq!(streams_per_connection(from_file), 40);
    assert_eq!(
        streams_per_connection(settings(&["--upstream=central:8015"])),
        DEFAULT_STREAMS_PER_CONNECTION
    );
    for refused in [
        &[
            "--upstream=central:8015",
            "--upstream-streams-per-connection=0",
        ][..],
        &["--upstream-streams-per-connection=10"],
    ] {
        assert!(
            Cli::try_parse_from(["flagd-proxy", "start"].iter().chain(refused)).is_err(),
            "{refused:?}"
        );
    }
}

fn settings_summary(settings: &crate::settings::Settings) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {} {} {:?} {:?} {} {:?} {:?} {:#o}",
        settings.management.header_timeout,
        settings.server.keepalive_interval,
        settings.management.keepalive_interval,
        settings.server.max_connection_age,
        settings.management.max_connections,
        settings.hub.max_document_bytes,
        settings.authz.mode,
        settings.authz.allow_namespaces,
        settings
            .tls
            .as_ref()
            .map(|tls| tls.cert.display().to_string())
            .unwrap_or_default(),
        settings.context_values,
        settings.serve.sync_socket_path,
        settings.serve.sync_socket_mode,
    )
}

/// The OTLP flags come from the config file like the others; headers as a list.
#[test]
fn otlp_settings_come_from_the_config_file() {
    let args = start_with_config(
        "yaml",
        "otlp-endpoint: http://collector:4317\n\
         otlp-header: [x-api-key=secret, x-tenant=shop]\n\
         otlp-interval: 10s\n",
        &[],
    )
    .expect("parses");
    let otlp = args.otlp.into_settings(None).expect("OTLP is on");
    assert_eq!(otlp.endpoint, "http://collector:4317");
    assert_eq!(
        otlp.headers,
        vec![
            ("x-api-key".to_owned(), "secret".to_owned()),
            ("x-tenant".to_owned(), "shop".to_owned())
        ]
    );
    assert_eq!(otlp.interval, Duration::from_secs(10));
}

/// The state directory is off by default; its flags come from the command line or the config
/// file, and its size bound means nothing without it.
#[test]
fn the_state_directory_comes_from_its_flags_or_the_config_file() {
    use crate::state::{DEFAULT_MAX_BYTES, StateSettings};

    let settings = |line: &[&str]| {
        crate::settings::Settings::from(start_args(
            Cli::try_parse_from(["flagd-proxy", "start"].iter().chain(line)).expect("parses"),
        ))
    };
    assert_eq!(settings(&[]).state, None);
    assert_eq!(
        settings(&["--state-dir=/var/lib/flagd-proxy"]).state,
        Some(StateSettings {
            dir: "/var/lib/flagd-proxy".into(),
            max_bytes: DEFAULT_MAX_BYTES,
        })
    );
    assert_eq!(
        settings(&["--state-dir", "/state", "--state-dir-max-bytes", "8Mi"])
            .state
            .map(|s| s.max_bytes),
        Some(8 << 20)
    );
    assert!(
        Cli::try_parse_from(["flagd-proxy", "start", "--state-dir-max-bytes=8Mi"]).is_err(),
        "the bound needs a directory"
    );
    let args = start_with_config("yaml", "state-dir: /state\nstate-dir-max-bytes: 1Mi\n", &[])
        .expect("parses");
    assert_eq!(
        args.state.into_settings(),
        Some(StateSettings {
            dir: "/state".into(),
            max_bytes: 1 << 20,
        })
    );
}
