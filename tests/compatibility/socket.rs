//! The unix-socket table: every client of the main table that can dial a unix socket, and
//! gRPC C-core through `grpcio` used directly, against the proxy's own socket.

use super::*;

/// A row of the unix-socket table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SocketClient {
    Client(Kind),
    /// `grpcio` calling `SyncFlags` itself (`interop/python/grpcio_sync.py`); `localhost`:
    /// with the channel option `grpc.default_authority` = `localhost`.
    Grpcio {
        localhost: bool,
    },
}

pub(crate) const SOCKET_CLIENTS: [SocketClient; 10] = [
    SocketClient::Client(Kind::Flagd),
    SocketClient::Client(Kind::FlagdLegacy),
    SocketClient::Client(Kind::Js),
    SocketClient::Client(Kind::Python),
    SocketClient::Client(Kind::Rust),
    SocketClient::Client(Kind::Java),
    SocketClient::Client(Kind::Go),
    SocketClient::Client(Kind::GoLegacy),
    SocketClient::Grpcio { localhost: false },
    SocketClient::Grpcio { localhost: true },
];

/// Log lines of a client that saw a stream reset: grpc-java's frame log, C-core's status.
const RESET_SIGNS: [&str; 2] = ["INBOUND RST_STREAM", "Received RST_STREAM"];
/// The same lines when the reset's code is PROTOCOL_ERROR (1): how the proxy's HTTP/2 layer
/// refuses a request's headers. Other resets are ordinary (grpc-java cancels a call past its
/// deadline, and the proxy's answer to that call's last frame is STREAM_CLOSED).
const PROTOCOL_ERROR_SIGNS: [&str; 2] = ["errorCode=1", "error code 1"];
/// How the clients' debug logs show the `:authority` they send (grpc-java's frame log,
/// C-core's `http` trace).
const AUTHORITY_SIGN: &str = ":authority: ";

impl SocketClient {
    pub(crate) fn name(self) -> &'static str {
        match self {
            SocketClient::Client(kind) => kind.name(),
            SocketClient::Grpcio { localhost: false } => "Python `grpcio` (C-core), default",
            SocketClient::Grpcio { localhost: true } => {
                "Python `grpcio` (C-core), `grpc.default_authority`"
            }
        }
    }

    /// How the client is pointed at the socket, for the document.
    pub(crate) fn how(self) -> &'static str {
        match self {
            SocketClient::Client(Kind::Flagd) => {
                "`--sources '[{\"uri\":\"unix://<path>\",\"provider\":\"grpc\",\"selector\":\"…\"}]'`"
            }
            SocketClient::Client(Kind::FlagdLegacy) => {
                "`--sources '[{\"uri\":\"grpc://unix://<path>\",\"provider\":\"grpc\"}]'`"
            }
            SocketClient::Client(Kind::Js) => "`socketPath`",
            SocketClient::Client(Kind::Rust) => {
                "`FlagdOptions { socket_path: Some(<path>), .. }` (its in-process sync then dials \
                 the socket with `:authority` `[::]:50051`)"
            }
            SocketClient::Client(Kind::Java) => {
                "`FlagdOptions.builder().socketPath(<path>)` (Netty's epoll domain-socket \
                 transport; see the notes on its dependencies)"
            }
            SocketClient::Client(Kind::Go) => {
                "`WithGrpcDialOptionsOverride` with `grpc.WithContextDialer` dialing the socket, \
                 the target staying `127.0.0.1:<port>` (`WithSocketPath` serves its RPC resolver \
                 only; `WithTargetUri` takes only targets that start with `envoy`, `dns`, `uds` \
                 or `xds`, not grpc-go's `unix:`)"
            }
            SocketClient::Client(Kind::Python | Kind::GoLegacy) => "—",
            SocketClient::Grpcio { localhost: false } => {
                "`grpc.insecure_channel(\"unix://<path>\")` and \
                 `channel.unary_stream(\"/flagd.sync.v1.FlagSyncService/SyncFlags\")` \
                 (`interop/python/grpcio_sync.py`, with the `grpcio` of the Python provider)"
            }
            SocketClient::Grpcio { localhost: true } => {
                "the same with `options=[(\"grpc.default_authority\", \"localhost\")]`"
            }
        }
    }

    /// Why the client cannot dial a unix socket, from its source.
    pub(crate) fn not_applicable(self) -> Option<&'static str> {
        match self {
            SocketClient::Client(Kind::Python) => Some(
                "its in-process sync dials `f\"{host}:{port}\"` (`GrpcWatcher._generate_channel`); \
                 its `Config` has no socket path",
            ),
            SocketClient::Client(Kind::GoLegacy) => Some(
                "its in-process sync dials `fmt.Sprintf(\"%s:%d\", Host, Port)` \
                 (`makeSyncProvider`) with `flagd/core`'s `grpc.DialContext` and no dial options \
                 of the caller's; `WithSocketPath` serves its RPC resolver only",
            ),
            _ => None,
        }
    }

    /// Whether the client sends the socket's path as `:authority` (raw or percent-encoded),
    /// which is no URI authority: the proxy must accept it on the unix socket (README, "Unix
    /// socket"), and the client's log must show that it sent it.
    fn sends_the_path(self) -> bool {
        matches!(
            self,
            SocketClient::Client(Kind::Java) | SocketClient::Grpcio { localhost: false }
        )
    }

    /// The client as a session sees it: its kind and how it is started.
    pub(crate) fn launch(self, versions: &Versions) -> Result<(Kind, Launch), Missing> {
        match self {
            SocketClient::Client(kind) => kind.launch(versions).map(|launch| (kind, launch)),
            SocketClient::Grpcio { localhost } => {
                // The Python provider's virtualenv, which has `grpcio`.
                Kind::Python.launch(versions)?;
                let dir = repo_root().join("interop/python");
                let mut cmd = StdCommand::new(cache_dir().join("venv/bin/python"));
                cmd.arg("-u")
                    .arg(dir.join("grpcio_sync.py"))
                    .current_dir(dir);
                match localhost {
                    true => cmd.env("INTEROP_AUTHORITY", "localhost"),
                    false => cmd.env_remove("INTEROP_AUTHORITY"),
                };
                Ok((Kind::Python, Launch::Stdout(cmd)))
            }
        }
    }
}

/// The proxy serves the sync protocols on a unix socket only; the client must evaluate
/// `INITIAL`, then `UPDATED` after the manifest changes.
pub(crate) async fn socket_run(client: SocketClient, kind: Kind, launch: Launch) -> Cell {
    let setup = Setup::new(false);
    let socket_dir = tempfile::tempdir().expect("socket directory");
    let socket = socket_dir.path().join("proxy.sock");
    let socket_arg = socket.display().to_string();
    let mut args = setup.args();
    args.extend(["--sync-socket-path", &socket_arg, "--sync-socket-only"]);
    let proxy = Proxy::start(&args).await;
    let target = Target {
        socket: Some(socket.clone()),
        // grpc-java and C-core show the `:authority` they send in their debug logs only.
        debug: client.sends_the_path(),
        ..Target::default()
    };
    let mut session = Session::spawn_to(kind, &launch, proxy.port, None, &target);
    session.name = client.name();

    if kind == Kind::FlagdLegacy {
        return match session.expect_value_or_refusal(INITIAL).await {
            Ok(None) => Cell::Pass,
            Ok(Some(_)) => Cell::NotApplicable(
                "dials the socket, but sends no selector: there too the proxy answers \
                 INVALID_ARGUMENT \"no selector given\""
                    .into(),
            ),
            Err(why) => {
                eprintln!("{}", session.report(&why, &proxy).await);
                Cell::Fail(why)
            }
        };
    }

    let result: Result<(), Outcome> = async {
        if let Some(reset) = ready_or_reset(&mut session).await? {
            return Err(Refused(reset));
        }
        session.expect_value(INITIAL, true, EVENT_TIMEOUT).await?;
        setup.change_to(UPDATED);
        session.expect_value(UPDATED, true, EVENT_TIMEOUT).await?;
        Ok(())
    }
    .await;
    let cell = match result {
        Ok(()) if client.sends_the_path() => sent_the_path(&session, &socket),
        Ok(()) => Cell::Pass,
        Err(Refused(reset)) => {
            Cell::Fail(format!("its stream was reset with PROTOCOL_ERROR: {reset}"))
        }
        Err(Failed(why)) => Cell::Fail(why),
    };
    if let Cell::Fail(why) = &cell {
        eprintln!(
            "{}",
            session.report(&format!("unix socket: {why}"), &proxy).await
        );
    }
    cell
}

enum Outcome {
    /// The client logged a stream reset with PROTOCOL_ERROR (this line).
    Refused(String),
    Failed(String),
}
use Outcome::{Failed, Refused};

impl From<String> for Outcome {
    fn from(why: String) -> Self {
        Failed(why)
    }
}

/// Waits for the client's `READY`, or for it to log a stream reset with PROTOCOL_ERROR:
/// `Ok(Some(line))`.
async fn ready_or_reset(session: &mut Session) -> Result<Option<String>, String> {
    let log = session.log.clone();
    let ready = tokio::select! {
        ready = session.ready() => ready,
        line = wait_for_refusal(&log) => return Ok(Some(line)),
    };
    match ready {
        Ok(()) => Ok(None),
        // A client that gives up after the reset (the grpcio client) may exit before its
        // last lines are collected.
        Err(why) => match timeout(EVENT_TIMEOUT, wait_for_refusal(&log)).await {
            Ok(line) => Ok(Some(line)),
            Err(_) => Err(why),
        },
    }
}

async fn wait_for_refusal(log: &Log) -> String {
    let refusal = |line: &&String| {
        RESET_SIGNS.iter().any(|sign| line.contains(sign))
            && PROTOCOL_ERROR_SIGNS.iter().any(|sign| line.contains(sign))
    };
    loop {
        if let Some(line) = log.lock().unwrap().iter().find(refusal) {
            return line.clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `pass` for a client whose log shows it sent the socket path, raw or percent-encoded, as
/// `:authority`; otherwise the row no longer shows what it is there for.
fn sent_the_path(session: &Session, socket: &Path) -> Cell {
    let sent = session
        .find_in_log(0, &[AUTHORITY_SIGN])
        .and_then(|line| sent_authority(&line));
    let path = socket.display().to_string();
    let encoded = path.trim_start_matches('/').replace('/', "%2F");
    match sent {
        Some(sent) if sent == path || sent == encoded => Cell::Pass,
        Some(sent) => Cell::Fail(format!(
            "served, but it sent `:authority` {sent:?}, not the socket path"
        )),
        None => Cell::Fail("served, but its log does not show the `:authority` it sent".into()),
    }
}

/// The `:authority` value in a debug log line that shows a request's headers.
fn sent_authority(line: &str) -> Option<String> {
    let start = line.find(AUTHORITY_SIGN)? + AUTHORITY_SIGN.len();
    let rest = &line[start..];
    let end = rest.find([',', ']', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim().to_owned())
}

pub(crate) type SocketTable = BTreeMap<SocketClient, Cell>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authority_is_read_from_grpc_java_and_c_core_logs() {
        let java = "DEBUG io.grpc.netty.NettyClientHandler - [id: 0x1] OUTBOUND HEADERS: \
                    streamId=3 headers=GrpcHttp2OutboundHeaders[:authority: /tmp/a/proxy.sock, \
                    :path: /flagd.sync.v1.FlagSyncService/SyncFlags]";
        let c_core = "SEND_INITIAL_METADATA{:path: /flagd.sync.v1.FlagSyncService/SyncFlags, \
                      :authority: tmp%2Fa%2Fproxy.sock, user-agent: grpc-python/1.85.3}";
        assert_eq!(sent_authority(java).as_deref(), Some("/tmp/a/proxy.sock"));
        assert_eq!(
            sent_authority(c_core).as_deref(),
            Some("tmp%2Fa%2Fproxy.sock")
        );
        assert_eq!(sent_authority("no headers here"), None);
    }
}
