"""OpenTelemetry tracing of a real in-process daemon, spans caught by the SDK's in-memory exporter.

The server is given its own TracerProvider (start_server(tracer_provider=...)),
so nothing here touches the process-wide OpenTelemetry globals; what needs
them (an application's provider that the SDK picks up, a daemon without the
otel packages) runs in a subprocess.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, format_trace_id

from stratad import tracing
from stratad.api.v1 import checkpoint_pb2, session_pb2
from stratad.config import Config
from stratad.server.app import start_server
from stratad.server.auth import token_digest
from stratad.server.logging_setup import JsonFormatter, RequestIdFilter
from stratad.server.registry import SERVICES

if TYPE_CHECKING:
    from conftest import Api

REPO_ROOT = Path(__file__).resolve().parents[2]
SAVE_STATE = "/stratad.api.v1.CheckpointService/SaveState"
LOAD_STATE = "/stratad.api.v1.CheckpointService/LoadState"
AGENT_TOKEN = "tracing-agent-token"


class Spans:
    """The spans a traced daemon finished, looked up the way the tests need them."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    def named(self, name: str, timeout: float = 5.0) -> list[ReadableSpan]:
        """The finished spans called ``name``; waits for at least one (a server span
        ends as its response is sent, maybe just after the client saw it)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [s for s in self.exporter.get_finished_spans() if s.name == name]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.02)

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"{len(found)} spans named {name!r}: {self.names()}"
        return found[0]

    def children(self, parent: ReadableSpan, name: str) -> list[ReadableSpan]:
        parent_id = parent.context.span_id
        return [
            s for s in self.named(name) if s.parent is not None and s.parent.span_id == parent_id
        ]

    def names(self) -> list[str]:
        return [s.name for s in self.exporter.get_finished_spans()]


@pytest.fixture
def spans() -> Spans:
    return Spans(InMemorySpanExporter())


@pytest.fixture
def traced_api(start_api: Callable[..., Api], spans: Spans) -> Iterator[Callable[..., Api]]:
    """``traced_api(sample_ratio=1.0, **config)``: an Api on a daemon tracing into ``spans``
    (parent-based sampling, ``sample_ratio`` for traces that start at the daemon)."""
    providers: list[TracerProvider] = []

    def start(sample_ratio: float = 1.0, **config: Any) -> Api:
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
        provider.add_span_processor(SimpleSpanProcessor(spans.exporter))
        providers.append(provider)
        api = start_api(**config)
        inprocess = api.server

        async def restart_traced() -> None:
            # start_api started it untraced: serve the same resources again, traced,
            # on a new port (stop() told the resources the daemon was stopping).
            await inprocess.server.stop(0)
            inprocess.resources.stopping.clear()
            inprocess.server = await start_server(
                inprocess.resources, SERVICES, tracer_provider=provider
            )

        inprocess.run(restart_traced())
        api.channel.close()
        return type(api)(
            inprocess.target, grpc.insecure_channel(inprocess.target), server=inprocess
        )

    yield start
    for provider in providers:
        provider.shutdown()


def test_save_state_is_a_server_span_with_journal_children(
    traced_api: Callable[..., Api], spans: Spans
) -> None:
    api = traced_api()
    api.create("s1")
    api.save("s1", b'{"step": 1}')

    server = spans.one(SAVE_STATE)
    assert server.kind == SpanKind.SERVER
    attributes = dict(server.attributes or {})
    assert attributes["rpc.system"] == "grpc"
    assert attributes["rpc.service"] == "stratad.api.v1.CheckpointService"
    assert attributes["rpc.method"] == "SaveState"
    assert attributes["rpc.grpc.status_code"] == grpc.StatusCode.OK.value[0]
    assert attributes[tracing.SESSION_ATTRIBUTE] == "s1"
    assert tracing.REASON_ATTRIBUTE not in attributes
    # With auth off the tenant is only what the caller claimed: not on the span.
    assert tracing.TENANT_ATTRIBUTE not in attributes

    (append,) = spans.children(server, "stratad.journal.append")
    assert dict(append.attributes or {})["stratad.bytes"] > 0
    (commit,) = spans.children(server, "stratad.journal.commit")
    (fsync,) = spans.children(commit, "stratad.journal.fsync")
    batch = dict(fsync.attributes or {})
    assert batch["stratad.batch.calls"] == 1
    assert batch["stratad.batch.journals"] == 1
    assert [link.context.span_id for link in fsync.links] == [commit.context.span_id]
    assert spans.children(server, "stratad.objects.commit")
    # All of it inside the call.
    for child in (append, commit, fsync):
        assert child.context.trace_id == server.context.trace_id
        assert server.start_time <= child.start_time <= child.end_time <= server.end_time


def test_streams_and_chunked_uploads_work_traced(
    traced_api: Callable[..., Api], spans: Spans, caplog: pytest.LogCaptureFixture
) -> None:
    """Every kind of handler under the tracing interceptor: bidi stream, server stream,
    a chunked upload (FindMissingChunks + SaveState), each with its SERVER span."""
    import stratad
    from stratad.sdk.client import save_request

    api = traced_api()
    big = bytes(range(256)) * 256  # 64 KiB: the SDK uploads it in chunks
    with stratad.Client(api.target) as client:
        client.create_session("s1")
        answers = list(client.save_states(save_request("s1", f"{i}".encode()) for i in range(3)))
        assert len(answers) == 3
        client.save_state("s1", big)
        client.save_state("s1", big + b"more")
        assert client.load_state("s1").data == big + b"more"
        events = client.watch_session("s1", from_version=1)
        assert next(events) is not None
        events.close()

    (stream,) = spans.named("/stratad.api.v1.CheckpointService/SaveStates")
    assert dict(stream.attributes or {})["rpc.grpc.status_code"] == 0
    assert len(spans.children(stream, "stratad.journal.append")) == 3
    assert len(spans.named(SAVE_STATE)) == 2
    (watch,) = spans.named("/stratad.api.v1.SessionService/WatchSession")
    # Closed by the client: CANCELLED, although no abort() ever said so, and the
    # span ended cleanly although grpc.aio closed the stream from another task.
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert (
        dict(watch.attributes or {})["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]
    )


def test_unsampled_calls_make_no_spans_and_a_sampled_caller_is_followed(
    traced_api: Callable[..., Api], spans: Spans
) -> None:
    api = traced_api(sample_ratio=0.0)
    api.create("s1")
    api.save("s1", b"{}")  # no traceparent: a trace of the daemon's, never sampled
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    traceparent = (("traceparent", f"00-{trace_id}-{parent_id}-01"),)  # 01: sampled
    request = checkpoint_pb2.SaveStateRequest(session_id="s1", data=b"{}")
    api.checkpoints.SaveState(request, timeout=10, metadata=traceparent)

    (save,) = spans.named(SAVE_STATE)  # only the call the caller sampled
    assert format_trace_id(save.context.trace_id) == trace_id
    assert save.parent is not None and f"{save.parent.span_id:016x}" == parent_id
    assert spans.children(save, "stratad.journal.append")
    assert {s.context.trace_id for s in spans.exporter.get_finished_spans()} == {
        save.context.trace_id
    }


def test_health_checks_are_not_traced(traced_api: Callable[..., Api], spans: Spans) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    api = traced_api()
    health = health_pb2_grpc.HealthStub(api.channel)
    health.Check(health_pb2.HealthCheckRequest(), timeout=10)
    api.create("s1")  # traced, and finished after the health check
    spans.one("/stratad.api.v1.SessionService/CreateSession")
    assert not [name for name in spans.names() if "Health" in name]


def test_a_large_save_on_the_worker_pool_is_traced_the_same(
    traced_api: Callable[..., Api], spans: Spans
) -> None:
    """A save too large for the event loop runs on a worker thread and syncs there."""
    api = traced_api()
    api.create("s1")
    api.save("s1", bytes(range(256)) * 1024)  # 256 KiB: over the inline limit

    server = spans.one(SAVE_STATE)
    assert spans.children(server, "stratad.objects.commit")
    assert spans.children(server, "stratad.journal.append")
    (fsync,) = spans.children(server, "stratad.journal.fsync")
    assert dict(fsync.attributes or {})["stratad.batch.journals"] == 1


def test_a_failed_call_records_its_status_and_reason(
    traced_api: Callable[..., Api], spans: Spans
) -> None:
    api = traced_api()
    with pytest.raises(grpc.RpcError) as excinfo:
        api.load("nobody")
    status = rpc_status.from_call(excinfo.value)  # type: ignore[arg-type]
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)

    span = spans.one(LOAD_STATE)
    attributes = dict(span.attributes or {})
    assert attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert info.reason  # e.g. SESSION_NOT_FOUND
    assert attributes[tracing.REASON_ATTRIBUTE] == info.reason


def test_a_malformed_request_records_its_reason(
    traced_api: Callable[..., Api], spans: Spans
) -> None:
    api = traced_api()
    save = api.channel.unary_unary(SAVE_STATE)  # raw bytes, not a message
    with pytest.raises(grpc.RpcError) as excinfo:
        save(b"\xff\xff\xff", timeout=10)
    assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    attributes = dict(spans.one(SAVE_STATE).attributes or {})
    assert attributes[tracing.REASON_ATTRIBUTE] == "MALFORMED_REQUEST"
    assert attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_the_tenant_settled_by_auth_is_a_span_attribute(
    traced_api: Callable[..., Api], spans: Spans, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[tokens]\n"{token_digest(AGENT_TOKEN)}" = {{ tenant = "acme", role = "agent" }}\n'
    )
    api = traced_api(auth="token", auth_tokens_file=str(tokens))
    metadata = (("authorization", f"Bearer {AGENT_TOKEN}"),)
    request = session_pb2.CreateSessionRequest(session_id="s1")
    api.sessions.CreateSession(request, timeout=10, metadata=metadata)

    span = spans.one("/stratad.api.v1.SessionService/CreateSession")
    assert dict(span.attributes or {})[tracing.TENANT_ATTRIBUTE] == "acme"


def test_gc_and_verify_are_spans_inside_their_call(
    traced_api: Callable[..., Api], spans: Spans
) -> None:
    from stratad.api.v1 import admin_pb2

    api = traced_api()
    api.create("s1")
    api.save("s1", b"x" * 10_000)
    api.call(api.admin.CollectGarbage, admin_pb2.CollectGarbageRequest())
    api.call(api.admin.Verify, admin_pb2.VerifyRequest())

    (gc,) = spans.children(spans.one("/stratad.api.v1.AdminService/CollectGarbage"), "stratad.gc")
    assert dict(gc.attributes or {})["stratad.gc.objects_removed"] == 0
    (verify,) = spans.children(spans.one("/stratad.api.v1.AdminService/Verify"), "stratad.verify")
    verified = dict(verify.attributes or {})
    assert verified["stratad.verify.objects_checked"] >= 1
    assert verified["stratad.verify.corrupt"] == 0


def test_sync_replication_is_part_of_the_save_trace(
    traced_api: Callable[..., Api], spans: Spans
) -> None:
    # obstore's in-memory object store: conditional writes like S3's.
    api = traced_api(replication="sync", remote_url="memory:///", node_id="node-1")
    api.create("s1")
    api.save("s1", b"y" * 20_000)

    save = spans.one(SAVE_STATE)
    (ship,) = spans.children(save, "stratad.replication.ship")
    shipped = dict(ship.attributes or {})
    assert shipped["stratad.session_id"] == "s1"
    assert shipped["stratad.bytes"] > 0
    (upload,) = spans.children(ship, "stratad.replication.upload_pack")
    assert dict(upload.attributes or {})["stratad.objects"] >= 1


def test_log_lines_of_a_call_carry_its_trace_id(
    traced_api: Callable[..., Api], spans: Spans
) -> None:
    api = traced_api()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    requests_log = logging.getLogger("stratad.requests")
    previous_level = requests_log.level
    requests_log.addHandler(handler)
    requests_log.setLevel(logging.DEBUG)  # one line per call, at debug
    try:
        api.create("s1")
        api.save("s1", b'{"step": 1}')
        server = spans.one(SAVE_STATE)
    finally:
        requests_log.removeHandler(handler)
        requests_log.setLevel(previous_level)

    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    (save_line,) = [line for line in lines if line.get("method") == SAVE_STATE]
    assert save_line["trace_id"] == format_trace_id(server.context.trace_id)
    assert len(save_line["span_id"]) == 16
    assert all("trace_id" in line for line in lines)


def test_no_trace_ids_in_logs_when_tracing_is_off(start_api: Callable[..., Api]) -> None:
    api = start_api()
    record = logging.makeLogRecord({"msg": "hello"})
    assert not tracing.active()
    api.create("s1")
    RequestIdFilter().filter(record)
    assert not hasattr(record, "trace_id")


def _run_python(
    script: str, tmp_path: Path, env: dict[str, str] | None = None, check_stderr: bool = False
) -> str:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("STRATAD_", "OTEL_"))}
    environment["PYTHONPATH"] = str(REPO_ROOT / "python")
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    result = subprocess.run(
        [sys.executable, str(path)],
        env={**environment, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    if check_stderr:  # no errors logged (no handler: warnings and errors go to stderr)
        assert "Failed to detach" not in result.stderr, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


#: A daemon in this process (start_server) and SDK calls to it, sync and async.
DAEMON_AND_SDK = """
    import asyncio, json, sys
    from pathlib import Path

    import stratad
    from stratad.config import Config
    from stratad.server.app import start_server
    from stratad.server.registry import open_resources

    async def main(tracing, data_dir):
        config = Config(listen="127.0.0.1:0", data_dir=Path(data_dir), metrics_listen="",
                        tracing=tracing)
        async with open_resources(config) as resources:
            server = await start_server(resources)
            try:
                async with stratad.AsyncClient(server.address) as client:
                    await client.create_session("s1")
                    await client.save_state("s1", b"{}")

                def sync_calls():
                    with stratad.Client(server.address) as client:
                        client.save_state("s1", b"{}")

                await asyncio.to_thread(sync_calls)
            finally:
                await server.stop(0)

    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "{tracing}", "{data_dir}"))
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    print(json.dumps(loaded))
"""


@pytest.mark.parametrize("mode", ["off", "console"])
def test_tracing_off_imports_no_opentelemetry(mode: str, tmp_path: Path) -> None:
    script = DAEMON_AND_SDK.replace("{tracing}", mode).replace("{data_dir}", str(tmp_path / "d"))
    out = _run_python(script, tmp_path)
    loaded = json.loads(out.strip().splitlines()[-1])
    if mode == "off":
        assert loaded == []
    else:  # the check above can fail: tracing on does import it
        assert "opentelemetry.sdk.trace" in loaded


def test_sdk_client_spans_share_the_trace_of_the_server_spans(tmp_path: Path) -> None:
    """An application that set a tracer provider: its SDK calls are CLIENT spans whose
    traceparent the daemon continues, inside the application's own span."""
    script = """
        import asyncio, json
        from pathlib import Path

        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        import stratad
        from stratad.config import Config
        from stratad.server.app import start_server
        from stratad.server.registry import open_resources

        exporter = InMemorySpanExporter()
        app_provider = TracerProvider()
        app_provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(app_provider)
        tracer = trace.get_tracer("agent")

        async def main():
            config = Config(listen="127.0.0.1:0", data_dir=Path("{data_dir}"), metrics_listen="")
            async with open_resources(config) as resources:
                # The daemon's own provider (as `stratad serve` would have), same exporter.
                server = await start_server(resources, tracer_provider=app_provider)
                try:
                    with tracer.start_as_current_span("agent step (async)"):
                        async with stratad.AsyncClient(server.address) as client:
                            await client.create_session("s1")
                            await client.save_state("s1", b"{}")
                            async for event in client.watch_session("s1", from_version=1):
                                break  # a stream the client cancels

                    def sync_call():
                        with tracer.start_as_current_span("agent step (sync)"):
                            with stratad.Client(server.address) as client:
                                client.save_state("s1", b"{}")

                    await asyncio.to_thread(sync_call)
                finally:
                    await server.stop(0)

        asyncio.run(main())
        print(json.dumps([
            {"name": s.name, "kind": s.kind.name, "trace": s.context.trace_id,
             "id": s.context.span_id, "parent": s.parent.span_id if s.parent else None}
            for s in exporter.get_finished_spans()
        ]))
    """.replace("{data_dir}", str(tmp_path / "d"))
    spans = json.loads(_run_python(script, tmp_path, check_stderr=True).strip().splitlines()[-1])
    by_id = {s["id"]: s for s in spans}
    calls: dict[str, list[str]] = {}  # agent step -> methods its SERVER spans served
    for server in (s for s in spans if s["kind"] == "SERVER"):
        client = by_id[server["parent"]]
        assert (client["kind"], client["name"]) == ("CLIENT", server["name"])
        agent = by_id[client["parent"]]
        assert agent["trace"] == client["trace"] == server["trace"]
        calls.setdefault(agent["name"], []).append(server["name"].rpartition("/")[2])
    assert sorted(calls["agent step (async)"]) == ["CreateSession", "SaveState", "WatchSession"]
    assert calls["agent step (sync)"] == ["SaveState"]


def test_config_tracing_keys_are_validated() -> None:
    from stratad.config import ConfigError, load_config

    config = load_config(
        {"tracing": "OTLP", "otlp_endpoint": "http://collector:4317"},
        {"STRATAD_TRACE_SAMPLE_RATIO": "0.25", "STRATAD_OTLP_INSECURE": "true"},
    )
    assert (config.tracing, config.otlp_endpoint) == ("otlp", "http://collector:4317")
    assert (config.trace_sample_ratio, config.otlp_insecure) == (0.25, True)
    assert Config(otlp_endpoint="collector:4317").otlp_endpoint == "collector:4317"
    for bad in (
        {"tracing": "jaeger"},
        {"trace_sample_ratio": "1.5"},
        {"otlp_endpoint": "grpc://collector:4317"},
        {"otlp_endpoint": "http://collector"},
    ):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            load_config(bad, {})


def test_tracing_on_without_the_extra_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from stratad.config import ConfigError

    real_find_spec = importlib.util.find_spec

    def without_exporter(name: str, *args: Any) -> Any:
        if name.startswith("opentelemetry.exporter"):
            return None
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_exporter)
    with pytest.raises(ConfigError, match=r"stratad\[otel\]"):
        tracing.provider_from_config(Config(tracing="otlp"))


def test_stopping_does_not_wait_for_a_collector_that_does_not_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import threading

    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    release = threading.Event()
    exported: list[int] = []

    class StuckExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            release.wait(60)  # a collector that never answers (for this test's life)
            exported.append(len(spans))
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(StuckExporter()))
    provider.get_tracer("t").start_span("last call").end()
    try:
        tracing.shutdown(provider)  # returns although the export is stuck
        assert exported == []
        assert "not exported" in caplog.text
    finally:
        release.set()


def test_sample_ratio_zero_records_nothing_started_here(tmp_path: Path) -> None:
    provider = tracing.provider_from_config(Config(tracing="console", trace_sample_ratio=0))
    assert provider is not None
    try:
        span = provider.get_tracer("t").start_span("x")
        assert not span.is_recording()
    finally:
        provider.shutdown()
