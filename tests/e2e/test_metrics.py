"""The Prometheus endpoint and the request log after real traffic to a real daemon."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

import stratad
from stratad.api.v1 import checkpoint_pb2, checkpoint_pb2_grpc

Daemon = Any
StartDaemon = Callable[..., Daemon]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(address: str) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and wanted <= ls]
    assert found, f"no sample {name}{labels}"
    return sum(found)


def scrape_when(address: str, name: str, **labels: str) -> Samples:
    """Scrape until a sample of ``name`` with ``labels`` shows up (10 s at most).

    The server counts a call when its handler has finished, which can be a
    moment after the client has read the reply: scraping at once may miss it.
    """
    wanted = set(labels.items())
    deadline = time.monotonic() + 10
    while True:
        samples = scrape(address)
        if any(n == name and wanted <= ls for n, ls in samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def rpc(method: str, code: str = "OK") -> dict[str, str]:
    service, name = method.split("/")
    return {"grpc_service": f"stratad.api.v1.{service}", "grpc_method": name, "grpc_code": code}


def test_metrics_and_request_log_after_traffic(
    start_daemon: StartDaemon, get_free_port: Callable[[], int]
) -> None:
    metrics = f"127.0.0.1:{get_free_port()}"
    daemon = start_daemon(
        "--metrics-listen", metrics,
        "--metrics-stats-interval", "0",
        "--metrics-tenant-labels", "5",
        "--log-level", "debug",
        "--log-format", "json",
    )  # fmt: skip
    # A growing conversation (up to ~50 KB): successive states share chunks.
    messages = [f"message {n}: the agent searched the web " * 25 for n in range(50)]
    states = [json.dumps({"messages": messages[: 10 * (i + 1)]}).encode() for i in range(5)]
    with stratad.Client(daemon.target, chunked_uploads=False) as client:
        client.create_session("s1")
        for data in states:
            client.save_state("s1", data)
        client.create_session("s2")
        client.pause_execution("s2")
        with pytest.raises(stratad.errors.NotFoundError):
            client.load_state("no-such-session")
        client.verify()
        client.collect_garbage()
        # A call with a request ID of its own.
        stub = checkpoint_pb2_grpc.CheckpointServiceStub(client.channel)
        stub.LoadState(
            checkpoint_pb2.LoadStateRequest(session_id="s1"),
            metadata=(("x-request-id", "req-42"), ("x-stratad-tenant", "default")),
            timeout=10,
        )
        stats = client.store_stats()

    samples = scrape(metrics)
    # gRPC: counts and latency by method and status code.
    assert value(samples, "grpc_server_handled_total", **rpc("CheckpointService/SaveState")) == 5
    assert value(samples, "grpc_server_started_total", grpc_method="SaveState") == 5
    assert value(samples, "grpc_server_handled_total", **rpc("CheckpointService/LoadState")) == 1
    not_found = rpc("CheckpointService/LoadState", "NOT_FOUND")
    assert value(samples, "grpc_server_handled_total", **not_found) == 1
    save = rpc("CheckpointService/SaveState")
    assert value(samples, "grpc_server_handling_seconds_count", **save) == 5
    assert value(samples, "grpc_server_handling_seconds_sum", **save) > 0
    assert value(samples, "grpc_server_handling_seconds_bucket", le="+Inf", **save) == 5
    # The journal: every acknowledged save was fsynced (durability fsync).
    assert value(samples, "stratad_journal_fsync_seconds_count") >= 5
    # The store, computed at this scrape (metrics_stats_interval 0).
    logical = sum(len(d) for d in states)
    assert value(samples, "stratad_store_logical_bytes") == logical
    assert value(samples, "stratad_store_checkpoints") == 5
    assert 0 < value(samples, "stratad_store_stored_bytes") < logical
    assert value(samples, "stratad_store_unique_bytes") == stats.unique_bytes < logical
    assert value(samples, "stratad_store_dedup_ratio") == pytest.approx(stats.dedup_ratio)
    assert value(samples, "stratad_store_dedup_ratio") > 1
    assert value(samples, "stratad_sessions_open") == 2
    assert value(samples, "stratad_sessions", status="paused") == 1
    # Maintenance results.
    assert value(samples, "stratad_verify_runs_total", tenant="default") == 1
    assert value(samples, "stratad_verify_last_ok", tenant="default") == 1
    assert value(samples, "stratad_verify_last_objects_checked", tenant="default") > 0
    assert value(samples, "stratad_gc_runs_total", tenant="default") == 1
    assert value(samples, "stratad_build_info") == 1
    assert value(samples, "process_resident_memory_bytes") > 0

    # The request log: one JSON line per call at debug level.
    assert daemon.stop() == 0
    lines = [json.loads(line) for line in daemon.output().splitlines() if line.startswith("{")]
    requests = [e for e in lines if e.get("logger") == "stratad.requests"]
    saves = [e for e in requests if e["method"].endswith("/SaveState")]
    assert len(saves) == 5
    assert {e["session"] for e in saves} == {"s1"}
    assert {e["tenant"] for e in saves} == {"default"}
    assert all(e["status"] == "OK" and e["duration_ms"] > 0 for e in saves)
    missing = [e for e in requests if e["status"] == "NOT_FOUND"]
    assert [e["session"] for e in missing] == ["no-such-session"]
    tagged = [e for e in requests if e["request_id"] == "req-42"]
    assert len(tagged) == 1 and tagged[0]["method"].endswith("/LoadState")


def test_metrics_text_log_and_a_taken_metrics_port(
    start_daemon: StartDaemon, get_free_port: Callable[[], int]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = start_daemon("--metrics-listen", f"127.0.0.1:{port}", wait=False)
        assert daemon.wait(timeout=30) == 1
        assert f"cannot serve metrics on 127.0.0.1:{port}" in daemon.output()

    metrics = f"127.0.0.1:{get_free_port()}"
    daemon = start_daemon("--metrics-listen", metrics, "--log-level", "debug")
    with grpc.insecure_channel(daemon.target) as channel:
        stub = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
        with pytest.raises(grpc.RpcError):
            stub.LoadState(
                checkpoint_pb2.LoadStateRequest(session_id="ghost"),
                metadata=(("x-request-id", "trace-7"),),
                timeout=10,
            )
    handled = scrape_when(metrics, "grpc_server_handled_total", grpc_code="NOT_FOUND")
    assert value(handled, "grpc_server_handled_total", grpc_code="NOT_FOUND") == 1
    assert daemon.stop() == 0
    line = next(
        line
        for line in daemon.output().splitlines()
        if "stratad.requests" in line and "ghost" in line
    )
    for part in (
        "LoadState",
        "tenant=default",
        "session=ghost",
        "status=NOT_FOUND",
        "request_id=trace-7",
    ):
        assert part in line, line
