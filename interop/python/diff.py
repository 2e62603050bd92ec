"""Differential program for the published openfeature-provider-flagd (in-process resolver):
evaluates every flag of every document of a job once per document, either reading the
document from a file (offline file mode) or syncing it from flagd-proxy over plaintext gRPC.

The protocol (input job, output lines) is described in `interop/differential.md`.

Environment:
  INTEROP_DIFF_JOB (the job file), INTEROP_DEBUG (any value: provider debug logging).

Stdout: one JSON object per document. Everything else goes to stderr.
"""

import json
import logging
import os
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from enum import Enum

from openfeature import api
from openfeature.contrib.provider.flagd import FlagdProvider
from openfeature.contrib.provider.flagd.config import ResolverType
from openfeature.evaluation_context import EvaluationContext
from openfeature.event import EventDetails, ProviderEvent

NAME = "interop-python-diff"
MAX_PARALLEL = 8
FIRST_EVENT_TIMEOUT_SECONDS = 15.0
SHUTDOWN_TIMEOUT_SECONDS = 10.0

BOOLEAN_DEFAULT = False
STRING_DEFAULT = "<default>"
NUMBER_DEFAULT = -1.0
OBJECT_DEFAULT = {"default": True}

log = logging.getLogger(NAME)
_stdout_lock = threading.Lock()


def encode(line: dict) -> str:
    return json.dumps(line, allow_nan=False)


def emit(text: str) -> None:
    with _stdout_lock:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def plain(value):
    """The value as plain JSON data (mappings and sequences of the SDK become dicts and lists)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Enum):
        return plain(value.value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [plain(v) for v in value]
    return str(value)


def spelling(value):
    """`reason` / `errorCode` as their OpenFeature spelling (the SDK enums' values)."""
    if value is None:
        return None
    if isinstance(value, Enum):
        value = value.value
    return str(value)


def evaluation_context(entry) -> EvaluationContext:
    if not isinstance(entry, Mapping):
        raise ValueError(f"a context is not a JSON object: {entry!r}")
    attributes = {k: v for k, v in entry.items() if k != "targetingKey"}
    targeting_key = entry.get("targetingKey")
    if targeting_key is not None and not isinstance(targeting_key, str):
        targeting_key = str(targeting_key)
    return EvaluationContext(targeting_key=targeting_key, attributes=attributes)


def details_of(details) -> dict:
    return {
        "value": plain(details.value),
        "variant": None if details.variant is None else str(details.variant),
        "reason": spelling(details.reason),
        "errorCode": spelling(details.error_code),
    }


class FirstEvent:
    """Remembers the first READY or ERROR event of one provider."""

    def __init__(self, provider_name: str):
        self.provider_name = provider_name
        self.done = threading.Event()
        self.kind: str | None = None
        self.message: str | None = None
        self._lock = threading.Lock()

    def _record(self, kind: str, details: EventDetails) -> None:
        # A handler added while the domain has no provider yet is run at once for the
        # SDK's no-op default provider; only this provider's own events count.
        if details.provider_name != self.provider_name:
            return
        with self._lock:
            if self.kind is not None:
                return
            self.kind = kind
            message = details.message
            if not message and details.error_code is not None:
                message = spelling(details.error_code)
            self.message = message
        self.done.set()

    def on_ready(self, details: EventDetails) -> None:
        self._record("READY", details)

    def on_error(self, details: EventDetails) -> None:
        self._record("ERROR", details)


def make_provider(job: dict, document: dict) -> FlagdProvider:
    if job["mode"] == "file":
        return FlagdProvider(
            resolver_type=ResolverType.FILE,
            offline_flag_source_path=str(document["path"]),
        )
    return FlagdProvider(
        resolver_type=ResolverType.IN_PROCESS,
        host=str(job["host"]),
        port=int(job["port"]),
        selector=str(document["selector"]),
        tls=False,
    )


def shut_down(doc_id: str, provider: FlagdProvider) -> None:
    def run() -> None:
        try:
            provider.shutdown()
        except Exception:  # noqa: BLE001 - only logged
            log.warning("%s: shutting the provider down failed:\n%s", doc_id, traceback.format_exc())

    thread = threading.Thread(target=run, name=f"shutdown-{doc_id}", daemon=True)
    thread.start()
    thread.join(SHUTDOWN_TIMEOUT_SECONDS)
    if thread.is_alive():
        log.warning("%s: the provider's shutdown did not end within %ss", doc_id, SHUTDOWN_TIMEOUT_SECONDS)


def evaluate(client, flags: list, contexts: list) -> dict:
    answers = {}
    for flag in flags:
        key = str(flag)
        per_context = []
        for context in contexts:
            per_context.append(
                [
                    details_of(client.get_boolean_details(key, BOOLEAN_DEFAULT, context)),
                    details_of(client.get_string_details(key, STRING_DEFAULT, context)),
                    details_of(client.get_float_details(key, NUMBER_DEFAULT, context)),
                    details_of(client.get_object_details(key, dict(OBJECT_DEFAULT), context)),
                ]
            )
        answers[key] = per_context
    return answers


def run_document(index: int, job: dict, document: dict, contexts: list) -> dict:
    doc_id = str(document["id"])
    if job["mode"] == "sync" and document.get("served", True) is False:
        return {"id": doc_id, "ready": False, "event": "not served"}

    flags = document.get("flags") or []
    provider = make_provider(job, document)
    domain = f"interop-diff-{index}-{doc_id}"
    client = api.get_client(domain)
    first = FirstEvent(provider.get_metadata().name)
    client.add_handler(ProviderEvent.PROVIDER_READY, first.on_ready)
    client.add_handler(ProviderEvent.PROVIDER_ERROR, first.on_error)
    try:
        api.set_provider(provider, domain)
        if not first.done.wait(FIRST_EVENT_TIMEOUT_SECONDS):
            return {"id": doc_id, "ready": False, "event": "timeout"}
        if first.kind != "READY":
            return {"id": doc_id, "ready": False, "event": first.kind, "detail": first.message}
        return {"id": doc_id, "ready": True, "answers": evaluate(client, flags, contexts)}
    finally:
        for event, handler in (
            (ProviderEvent.PROVIDER_READY, first.on_ready),
            (ProviderEvent.PROVIDER_ERROR, first.on_error),
        ):
            try:
                client.remove_handler(event, handler)
            except Exception:  # noqa: BLE001 - only logged
                log.debug("%s: removing a handler failed", doc_id, exc_info=True)
        shut_down(doc_id, provider)


def handle(index: int, job: dict, document, contexts: list) -> None:
    doc_id = str(document.get("id")) if isinstance(document, Mapping) else f"#{index}"
    try:
        if not isinstance(document, Mapping):
            raise ValueError(f"document #{index} is not a JSON object")
        text = encode(run_document(index, job, document, contexts))
    except Exception as error:  # noqa: BLE001 - every failure is the document's line
        log.warning("%s: %s", doc_id, traceback.format_exc())
        text = encode(
            {
                "id": doc_id,
                "ready": False,
                "event": "exception",
                "detail": f"{type(error).__name__}: {error}",
            }
        )
    try:
        emit(text)
    except Exception:  # noqa: BLE001
        log.error("%s: writing its line failed:\n%s", doc_id, traceback.format_exc())


def load_job() -> dict:
    path = os.environ.get("INTEROP_DIFF_JOB", "")
    if not path:
        raise ValueError("environment variable INTEROP_DIFF_JOB is required")
    with open(path, encoding="utf-8") as file:
        job = json.load(file)
    if not isinstance(job, dict):
        raise ValueError("the job is not a JSON object")
    if job.get("mode") not in ("file", "sync"):
        raise ValueError(f"unknown mode: {job.get('mode')!r}")
    if not isinstance(job.get("documents"), list):
        raise ValueError("the job has no `documents` list")
    return job


def main() -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if os.environ.get("INTEROP_DEBUG") else logging.WARNING,
        format=f"{NAME} [%(levelname)s] %(threadName)s %(name)s: %(message)s",
    )
    try:
        job = load_job()
    except Exception as error:  # noqa: BLE001
        sys.stderr.write(f"{NAME}: cannot read the job: {type(error).__name__}: {error}\n")
        return 2

    if job["mode"] == "sync":
        # Otherwise the provider would read this file instead of syncing.
        os.environ.pop("FLAGD_OFFLINE_FLAG_SOURCE_PATH", None)

    documents = job["documents"]
    context_error = None
    try:
        contexts = [evaluation_context(entry) for entry in job.get("contexts") or [{}]]
    except Exception as error:  # noqa: BLE001
        context_error = f"{type(error).__name__}: {error}"
        contexts = []

    if context_error is not None:
        for index, document in enumerate(documents):
            doc_id = str(document.get("id")) if isinstance(document, Mapping) else f"#{index}"
            emit(encode({"id": doc_id, "ready": False, "event": "exception", "detail": context_error}))
        return 0

    with ThreadPoolExecutor(max_workers=MAX_PARALLEL, thread_name_prefix="doc") as pool:
        futures = [
            pool.submit(handle, index, job, document, contexts)
            for index, document in enumerate(documents)
        ]
        for future in futures:
            try:
                future.result()
            except Exception:  # noqa: BLE001 - handle() already reports per document
                log.error("a document's worker failed:\n%s", traceback.format_exc())
    return 0


if __name__ == "__main__":
    try:
        status = main()
    except KeyboardInterrupt:
        status = 130
    sys.stdout.flush()
    sys.stderr.flush()
    # gRPC's and the providers' background threads need not be joined.
    os._exit(status)
