"""The front door's edge limits, from a client's side (docs/security.md#edge-limits):
connections over the cap are closed while the open ones keep serving, idle
connections are closed with GOAWAY (gRPC clients reconnect), a client that
does not speak HTTP/2 is told so, oversized metadata is RESOURCE_EXHAUSTED,
and one connection may carry more concurrent calls than hyper's default 200."""

from __future__ import annotations

import contextlib
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
            started = time.monotonic()
            # Closed at once, with the preface it sent unread: a reset is fine too.
            with contextlib.suppress(ConnectionResetError):
                _read_until_closed(refused, 5.0)
            assert time.monotonic() - started < 2.0, "a connection over the cap is closed at once"
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


def _zero_window_client(target: str) -> tuple[socket.socket, Any]:
    """An HTTP/2 client that never lets the server send it a byte of DATA."""
    import h2.config
    import h2.connection
    import h2.settings

    host, _, port = target.rpartition(":")
    sock = socket.create_connection((host, int(port)))
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    sock.sendall(conn.data_to_send())
    return sock, conn


def _open_call(sock: socket.socket, conn: Any, path: str, body: bytes, end: bool = True) -> int:
    stream = conn.get_next_available_stream_id()
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    conn.send_headers(stream, headers)
    conn.send_data(stream, body, end_stream=end)
    sock.sendall(conn.data_to_send())
    return int(stream)


def _send_for(sock: socket.socket, conn: Any, stream: int, body: bytes, seconds: float) -> None:
    """Send ``body`` on ``stream`` as fast as flow control lets, for ``seconds``
    (taking the server's window updates, never reading its answers' data)."""
    sock.settimeout(0.05)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        window = min(conn.local_flow_control_window(stream), conn.max_outbound_frame_size)
        if body and window > 0:
            conn.send_data(stream, body[:window])
            body = body[window:]
        sock.sendall(conn.data_to_send())
        with contextlib.suppress(TimeoutError):
            conn.receive_data(sock.recv(65536))


def _grpc_frame(message: bytes) -> bytes:
    return struct.pack(">BI", 0, len(message)) + message


def test_answers_a_client_does_not_read_stay_within_the_budget(
    inprocess_server: Callable[..., Any],
) -> None:
    """60 LoadStates of a 1 MiB state from a client whose window is 0: once
    its answers hold its share of max_inflight_bytes (1/8), its next calls end
    RESOURCE_EXHAUSTED instead of queueing, before they read the state (the
    answer is charged before it is built); others are served meanwhile."""
    import os

    from stratad.api.v1 import checkpoint_pb2, checkpoint_pb2_grpc

    budget = 16 << 20
    server = inprocess_server(SERVICES, max_inflight_bytes=budget)
    front = server.server.front
    with grpc.insecure_channel(server.target) as channel:
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        checkpoints = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="big"), timeout=DEADLINE)
        state = os.urandom(1 << 20)
        save = checkpoint_pb2.SaveStateRequest(session_id="big", data=state)
        checkpoints.SaveState(save, timeout=DEADLINE)
        load = checkpoint_pb2.LoadStateRequest(session_id="big")
        domain = server.resources.engine.checkpoints
        read_state, reads = domain._read, []

        def counted_read(*args: Any) -> bytes:
            reads.append(1)
            return bytes(read_state(*args))

        domain._read = counted_read
        sock, conn = _zero_window_client(server.target)
        try:
            for _ in range(60):
                _open_call(
                    sock,
                    conn,
                    "/stratad.api.v1.CheckpointService/LoadState",
                    _grpc_frame(load.SerializeToString()),
                )
            deadline = time.monotonic() + 10
            refused = 0
            sock.settimeout(0.2)
            while refused < 50 and time.monotonic() < deadline:
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                for event in conn.receive_data(data):
                    headers = dict(getattr(event, "headers", None) or [])
                    if headers.get(b"grpc-status") == b"8":
                        refused += 1
                sock.sendall(conn.data_to_send())
            assert refused >= 50, f"only {refused} of 60 unread answers were refused"
            assert len(reads) <= 60 - refused, f"{len(reads)} states read for {refused} refusals"
            assert front.answer_bytes <= budget // 8 + (1 << 20) + 1024
            # Everyone else is served meanwhile, large answers included.
            assert checkpoints.LoadState(load, timeout=DEADLINE).data == state
        finally:
            sock.close()
    deadline = time.monotonic() + 10
    while front.answer_bytes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert front.answer_bytes == 0, "a closed connection gives its answers' bytes back"


def test_a_stream_whose_answers_are_not_read_stops_being_read(
    inprocess_server: Callable[..., Any],
) -> None:
    """grpc.aio stops after a window's worth; the native front door did 21,000
    saves for a client that never read one answer."""
    from stratad.api.v1 import checkpoint_pb2

    server = inprocess_server(SERVICES)
    with grpc.insecure_channel(server.target) as channel:
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="s"), timeout=DEADLINE)
        item = checkpoint_pb2.SaveStatesRequest(
            request=checkpoint_pb2.SaveStateRequest(session_id="s", data=b'{"n": 1}')
        )
        body = _grpc_frame(item.SerializeToString()) * 4000
        sock, conn = _zero_window_client(server.target)
        try:
            stream = _open_call(
                sock, conn, "/stratad.api.v1.CheckpointService/SaveStates", b"", end=False
            )
            _send_for(sock, conn, stream, body, seconds=3.0)
            version = sessions.GetSession(
                session_pb2.GetSessionRequest(session_id="s"), timeout=DEADLINE
            ).session.version
        finally:
            sock.close()
    assert 1 < version < 2000, f"{version - 1} saves done for a client that read no answer"
