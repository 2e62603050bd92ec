"""What the Python interop clients share: the stdout protocol (`READY`, `VALUE <value>`),
failing with a message on stderr, and exiting when stdin reaches EOF."""

import os
import sys
import threading

_emit_lock = threading.Lock()


def fail(client: str, message: str) -> None:
    sys.stderr.write(f"{client}: {message}\n")
    sys.stderr.flush()
    os._exit(2)


def required(client: str, name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        fail(client, f"environment variable {name} is required")
    return value


def emit(line: str) -> None:
    """Writes one whole line, also when several threads emit at once."""
    try:
        with _emit_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except (BrokenPipeError, OSError):
        os._exit(0)


def exit_on_stdin_eof() -> None:
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass
    # Skip interpreter shutdown: gRPC's threads need not be joined.
    os._exit(0)
