"""Interop client: the published openfeature-provider-flagd, in-process resolver,
syncing from flagd-proxy over gRPC.

Environment:
  FLAGD_HOST, FLAGD_PORT, FLAGD_SOURCE_SELECTOR, FLAGD_TLS (true/false),
  FLAGD_SERVER_CERT_PATH (CA file, TLS only), INTEROP_FLAG_KEY (a string flag),
  INTEROP_DEBUG (any value: provider debug logging on stderr).

Stdout protocol: `READY` once the provider is ready, then `VALUE <value>` each
time the evaluated value differs from the last printed one. Everything else goes
to stderr. The process exits when stdin reaches EOF.
"""

import logging
import os
import sys
import threading
import time

from openfeature import api
from openfeature.contrib.provider.flagd import FlagdProvider
from openfeature.contrib.provider.flagd.config import ResolverType
from openfeature.provider import ProviderStatus
from stdio_protocol import emit, exit_on_stdin_eof, fail, required

NAME = "interop-python"
DEFAULT_VALUE = "<default>"
POLL_SECONDS = 0.1

log = logging.getLogger(NAME)


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
