"""The front door's edge limits, from a client's side (docs/security.md#edge-limits):
connections over the cap are closed while the open ones keep serving, idle
connections are closed with GOAWAY (gRPC clients reconnect), a client that
does not speak HTTP/2 is told so, oversized metadata is RESOURCE_EXHAUSTED,
and one connection may carry more concurrent calls than hyper's default 200."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stratad.api.v1 import session_pb2, session_pb2_grpc
from stratad.server.registry import SERVICES

DEADLINE = 15.0
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
GOAWAY = 7


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    """(type, payload) of each whole HTTP/2 frame in ``data``."""
    frames = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        frames.append((data[3], data[9 : 9 + length]))
        data = data[9 + length :]
    return frames


def _read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection; how long
    that took. Acknowledges SETTINGS and PINGs, as every HTTP/2 client does
    (a graceful GOAWAY waits for a PING round trip)."""
    sock.settimeout(timeout)
    started, received, answered = time.monotonic(), b"", 0
    while chunk := sock.recv(65536):
        received += chunk
        frames = _frames(received)
        for kind, payload in frames[answered:]:
            if kind == 4 and payload:  # SETTINGS (not an ACK: those are empty)
                sock.sendall(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")
            elif kind == 6 and len(payload) == 8:  # PING
                sock.sendall(b"\x00\x00\x08\x06\x01\x00\x00\x00\x00" + payload)
        answered = len(frames)
    return received, time.monotonic() - started


def _h2_connection(target: str) -> socket.socket:
    host, _, port = target.rpartition(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(PREFACE + EMPTY_SETTINGS)
    return sock


def _check(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=DEADLINE
        )
    return int(reply.status)


def test_connections_over_the_cap_are_closed_and_the_open_ones_keep_serving(
    inprocess_server: Callable[..., Any],
) -> None:
    server = inprocess_server(SERVICES, max_connections=3)
    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE).status == 1
        squatters = [_h2_connection(server.target) for _ in range(2)]  # the cap is reached
        try:
            time.sleep(0.2)
            refused = _h2_connection(server.target)
            _, seconds = _read_until_closed(refused, 5.0)
            assert seconds < 2.0, "a connection over the cap is closed at once"
            refused.close()
            for _ in range(20):  # the open connection keeps serving
                assert health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE).status == 1
        finally:
            for sock in squatters:
                sock.close()
    deadline = time.monotonic() + 10
    while True:  # once they are gone, new clients get in again
        try:
            assert _check(server.target) == 1
            break
        except grpc.RpcError:
            assert time.monotonic() < deadline, "closed connections must give their places back"
            time.sleep(0.1)


def test_an_idle_connection_is_closed_with_goaway_and_clients_reconnect(
    inprocess_server: Callable[..., Any],
) -> None:
    server = inprocess_server(SERVICES, connection_idle_timeout=0.5)
    idle = _h2_connection(server.target)
    received, seconds = _read_until_closed(idle, 5.0)
    idle.close()
    assert GOAWAY in [kind for kind, _ in _frames(received)]
    assert 0.4 < seconds < 3.0
    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(3):  # each after the last connection went idle and was closed
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE).status == 1
            time.sleep(0.8)


@pytest.mark.parametrize(
    "greeting", [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x02\x00"]
)
def test_a_client_that_does_not_speak_http2_gets_goaway_not_a_reset(
    inprocess_server: Callable[..., Any], greeting: bytes
) -> None:
    server = inprocess_server(SERVICES)
    host, _, port = server.target.rpartition(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(greeting)
        received, _ = _read_until_closed(sock, 5.0)  # raises on a TCP reset
    frames = _frames(received)
    assert [kind for kind, _ in frames] == [4, GOAWAY]
    last_stream, code = struct.unpack(">II", frames[1][1][:8])
    assert (last_stream, code) == (0, 1)  # PROTOCOL_ERROR
    assert b"serves gRPC" in frames[1][1][8:]
    assert _check(server.target) == 1


def test_oversized_metadata_is_resource_exhausted(inprocess_server: Callable[..., Any]) -> None:
    server = inprocess_server(SERVICES, max_header_bytes=4096)
    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            health.Check(
                health_pb2.HealthCheckRequest(),
                timeout=DEADLINE,
                metadata=[("x-big", "a" * 5000)],
            )
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "header list" in str(caught.value.details())
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE).status == 1


def test_one_connection_carries_more_than_200_concurrent_calls(
    inprocess_server: Callable[..., Any],
) -> None:
    """hyper's default is 200 concurrent streams: the 201st waited until its deadline."""
    server = inprocess_server(SERVICES)
    with grpc.insecure_channel(server.target) as channel:
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="w"), timeout=DEADLINE)
        request = session_pb2.WatchSessionRequest(session_id="w")
        watches = [sessions.WatchSession(request, timeout=30) for _ in range(220)]
        try:
            started = time.monotonic()
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1
            assert time.monotonic() - started < 5
        finally:
            for watch in watches:
                watch.cancel()
