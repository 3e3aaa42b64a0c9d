"""A real ``stratad serve --tracing otlp`` exports its spans to a real OTLP/gRPC receiver.

The receiver is the OpenTelemetry collector's TraceService (generated code
from opentelemetry-proto) served by grpcio in this process: every
ExportTraceServiceRequest the daemon's exporter sends is kept as it arrived.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import TYPE_CHECKING, Any

import grpc
import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc", reason="no otel extra")

from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)

import stratad

if TYPE_CHECKING:
    from conftest import Daemon

SAVE_STATE = "/stratad.api.v1.CheckpointService/SaveState"


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """An OTLP trace receiver that keeps every span it is sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []

    def Export(self, request: Any, context: Any) -> Any:
        with self._lock:
            self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[dict[str, str], Any]]:
        """(resource attributes, span) of every span received."""
        with self._lock:
            requests = list(self.requests)
        found = []
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    found.extend((resource, span) for span in scope_spans.spans)
        return found

    def wait_for(self, name: str, timeout: float = 20.0) -> list[tuple[dict[str, str], Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.spans()
            if any(span.name == name for _, span in spans):
                return spans
            time.sleep(0.05)
        pytest.fail(f"no span {name!r} received in {timeout}s; got {[s.name for _, s in spans]}")


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(0)


def test_serve_exports_spans_to_an_otlp_receiver(
    start_daemon: Callable[..., Daemon], receiver: tuple[Receiver, int]
) -> None:
    collector, port = receiver
    daemon = start_daemon(
        "--tracing",
        "otlp",
        "--otlp-endpoint",
        f"http://127.0.0.1:{port}",
        "--log-format",
        "json",
        "--log-level",
        "debug",
        # The standard OTEL_* variables apply: export batches every 100 ms.
        env={"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": "stratad-e2e"},
    )
    with stratad.Client(daemon.target) as client:
        client.create_session("s1")
        client.save_state("s1", b'{"step": 1}')

    # Spans arrive while the daemon runs (not only when it stops and flushes).
    spans = collector.wait_for(SAVE_STATE)
    resource, save = next((r, s) for r, s in spans if s.name == SAVE_STATE)
    assert resource["service.name"] == "stratad-e2e"
    assert resource["service.version"] == stratad.__version__
    attributes = {a.key: a.value for a in save.attributes}
    assert attributes["rpc.method"].string_value == "SaveState"
    assert attributes["rpc.grpc.status_code"].int_value == 0
    assert attributes["stratad.session_id"].string_value == "s1"
    in_trace = {s.name for _, s in spans if s.trace_id == save.trace_id}
    assert {"stratad.journal.append", "stratad.journal.commit", "stratad.journal.fsync"} <= in_trace

    assert daemon.stop() == 0
    # The daemon's JSON request log line for the call names the same trace.
    lines = [json.loads(line) for line in daemon.output().splitlines() if line.startswith("{")]
    (logged,) = [line for line in lines if line.get("method") == SAVE_STATE]
    assert logged["trace_id"] == save.trace_id.hex()
    assert logged["span_id"] == save.span_id.hex()
