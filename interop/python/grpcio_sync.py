"""Interop client: gRPC C-core through `grpcio` used directly (no provider), calling
`flagd.sync.v1.FlagSyncService/SyncFlags` over a unix socket.

Environment:
  INTEROP_SOCKET_PATH (the unix socket), FLAGD_SOURCE_SELECTOR, INTEROP_FLAG_KEY (a string
  flag), INTEROP_AUTHORITY (optional: the channel option `grpc.default_authority`; without
  it C-core picks the `:authority` itself), INTEROP_DEBUG (any value: C-core's `http` trace
  on stderr, which shows the headers of each call, `:authority` included).

Stdout protocol: `READY` once the first flag configuration has arrived, then
`VALUE <value>` each time the default variant's value of the flag differs from the last
printed one (this client does not evaluate targeting). When the call ends, its status goes
to stderr as `interop-grpcio: status <CODE>: <details>` and the process exits with status 1.
The process exits when stdin reaches EOF.
"""

import json
import os
import sys
import threading

if os.environ.get("INTEROP_DEBUG"):
    # C-core reads its trace settings once, when it is loaded.
    os.environ.setdefault("GRPC_TRACE", "http")
    os.environ.setdefault("GRPC_VERBOSITY", "debug")

import grpc  # noqa: E402
from openfeature.schemas.protobuf.flagd.sync.v1 import sync_pb2  # noqa: E402
from stdio_protocol import emit, exit_on_stdin_eof, fail, required  # noqa: E402

NAME = "interop-grpcio"
METHOD = "/flagd.sync.v1.FlagSyncService/SyncFlags"


def default_value(configuration: str, flag_key: str) -> str:
    """The value of the flag's default variant in a flagd flag configuration."""
    flag = json.loads(configuration)["flags"][flag_key]
    return str(flag["variants"][flag["defaultVariant"]])


def main() -> None:
    socket_path = required(NAME, "INTEROP_SOCKET_PATH")
    selector = os.environ.get("FLAGD_SOURCE_SELECTOR", "")
    flag_key = required(NAME, "INTEROP_FLAG_KEY")
    authority = os.environ.get("INTEROP_AUTHORITY") or None

    threading.Thread(target=exit_on_stdin_eof, name="stdin-eof", daemon=True).start()

    options = [("grpc.default_authority", authority)] if authority else []
    channel = grpc.insecure_channel(f"unix://{socket_path}", options=options)
    sync_flags = channel.unary_stream(
        METHOD,
        request_serializer=sync_pb2.SyncFlagsRequest.SerializeToString,
        response_deserializer=sync_pb2.SyncFlagsResponse.FromString,
    )
    request = sync_pb2.SyncFlagsRequest(selector=selector)
    last = None
    try:
        for response in sync_flags(request, wait_for_ready=True):
            value = default_value(response.flag_configuration, flag_key)
            if last is None:
                emit("READY")
            if value != last:
                last = value
                emit(f"VALUE {value}")
    except grpc.RpcError as error:
        sys.stderr.write(f"{NAME}: status {error.code().name}: {error.details()}\n")
        sys.stderr.flush()
        os._exit(1)
    sys.stderr.write(f"{NAME}: the stream ended without a status\n")
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        os._exit(0)
