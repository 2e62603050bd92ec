"""Interop client: the published openfeature-provider-flagd, in-process resolver,
syncing from flagd-proxy over gRPC.

Environment:
  FLAGD_HOST, FLAGD_PORT, FLAGD_SOURCE_SELECTOR, FLAGD_TLS (true/false),
  FLAGD_SERVER_CERT_PATH (CA file, TLS only), INTEROP_FLAG_KEY (a string flag),
  INTEROP_DEBUG (any value: provider debug logging on stderr),
  INTEROP_EVENTS (`1`: also print every provider event, see below).

Stdout protocol: `READY` once the provider is ready, then `VALUE <value>` each
time the evaluated value differs from the last printed one. With INTEROP_EVENTS=1,
also `EVENT <READY|STALE|ERROR|CHANGED> <unix millis>` for every provider event as
it is emitted. Everything else goes to stderr. The process exits when stdin reaches EOF.
"""

import logging
import os
import sys
import threading
import time

from openfeature import api
from openfeature.contrib.provider.flagd import FlagdProvider
from openfeature.contrib.provider.flagd.config import ResolverType
from openfeature.event import EventDetails, ProviderEvent
from openfeature.provider import ProviderStatus
from stdio_protocol import emit, exit_on_stdin_eof, fail, required

NAME = "interop-python"
DEFAULT_VALUE = "<default>"
POLL_SECONDS = 0.1

log = logging.getLogger(NAME)

EVENT_NAMES = {
    ProviderEvent.PROVIDER_READY: "READY",
    ProviderEvent.PROVIDER_STALE: "STALE",
    ProviderEvent.PROVIDER_ERROR: "ERROR",
    ProviderEvent.PROVIDER_CONFIGURATION_CHANGED: "CHANGED",
}


def record_events() -> None:
    """Prints `EVENT <name> <unix millis>` for every provider event."""
    for event, name in EVENT_NAMES.items():

        def handler(_details: EventDetails, name: str = name) -> None:
            emit(f"EVENT {name} {time.time_ns() // 1_000_000}")

        api.add_handler(event, handler)


def main() -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if os.environ.get("INTEROP_DEBUG") else logging.WARNING,
        format="interop-python [%(levelname)s] %(name)s: %(message)s",
    )

    host = required(NAME, "FLAGD_HOST")
    port_text = required(NAME, "FLAGD_PORT")
    try:
        port = int(port_text)
    except ValueError:
        fail(NAME, f"FLAGD_PORT is not a port: {port_text}")
    selector = os.environ.get("FLAGD_SOURCE_SELECTOR") or None
    tls = os.environ.get("FLAGD_TLS", "false").strip().lower() == "true"
    cert_path = os.environ.get("FLAGD_SERVER_CERT_PATH") or None
    flag_key = required(NAME, "INTEROP_FLAG_KEY")

    if tls and cert_path and not os.path.isfile(cert_path):
        fail(NAME, f"FLAGD_SERVER_CERT_PATH does not exist: {cert_path}")

    threading.Thread(target=exit_on_stdin_eof, name="stdin-eof", daemon=True).start()
    if os.environ.get("INTEROP_EVENTS") == "1":
        record_events()

    provider = FlagdProvider(
        resolver_type=ResolverType.IN_PROCESS,
        host=host,
        port=port,
        selector=selector,
        tls=tls,
        cert_path=cert_path if tls else None,
    )
    # Initialisation runs in the background; a first attempt that misses the provider's
    # deadline leaves it NOT_READY/ERROR until its own reconnect succeeds.
    api.set_provider(provider)
    client = api.get_client()

    while client.get_provider_status() != ProviderStatus.READY:
        time.sleep(POLL_SECONDS)
    emit("READY")

    last = None
    while True:
        try:
            value = client.get_string_value(flag_key, DEFAULT_VALUE)
        except Exception:  # noqa: BLE001 - keep polling, report on stderr
            log.exception("evaluation failed")
        else:
            if value != last:
                last = value
                emit(f"VALUE {value}")
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        os._exit(0)
