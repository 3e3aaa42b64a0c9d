"""The blocking Client's unary calls over the native HTTP/2 client (sdk/native.py).

What a caller sees must not depend on the transport: the same responses, the
same errors (class, message, reason), deadlines, retries of calls that never
reached the daemon, and a transparent reconnect after the daemon restarts.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

import stratad
from stratad import errors, native
from stratad.api.v1 import session_pb2
from stratad.sdk import native as sdk_native

if TYPE_CHECKING:
    from conftest import Api


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Counting:
    """A NativeChannel that counts the attempts made through it."""

    def __init__(self, channel: Any) -> None:
        self.channel, self.attempts = channel, 0

    def unary(self, *args: Any) -> Any:
        self.attempts += 1
        return self.channel.unary(*args)


def count_attempts(client: stratad.Client) -> Counting:
    assert client._native is not None
    counting = Counting(client._native._channel)
    client._native._channel = counting  # type: ignore[assignment]
    return counting


def test_plaintext_clients_send_unary_calls_natively_and_streams_over_grpc(api: Api) -> None:
    with stratad.Client(api.target) as client:
        assert isinstance(client.sessions.GetSession, sdk_native.UnaryMethod)
        assert isinstance(client.checkpoints.SaveState, sdk_native.UnaryMethod)
        assert not isinstance(client.checkpoints.SaveStates, sdk_native.UnaryMethod)
        assert not isinstance(client.sessions.WatchSession, sdk_native.UnaryMethod)
    with stratad.Client(api.target, native_calls=False) as plain:
        assert not isinstance(plain.sessions.GetSession, sdk_native.UnaryMethod)


def test_native_and_grpc_calls_answer_alike(api: Api) -> None:
    with (
        stratad.Client(api.target) as fast,
        stratad.Client(api.target, native_calls=False) as plain,
    ):
        fast.create_session("s", labels={"k": "v"})
        saved = fast.save_state("s", b"x" * 100_000, content_type="text/plain")
        assert plain.get_session("s") == fast.get_session("s")
        assert plain.load_state("s") == fast.load_state("s")
        assert fast.load_state("s").checkpoint.checkpoint_id == saved.checkpoint_id
        assert list(plain.list_sessions()) == list(fast.list_sessions())

        failures = []
        for client in (fast, plain):
            with pytest.raises(errors.StratadError) as caught:
                client.save_state("s", b"y", expected_version=99)
            failures.append(caught.value)
        one, other = failures
        assert type(one) is type(other) is errors.VersionConflictError
        assert (one.message, one.reason, one.metadata) == (
            other.message,
            other.reason,
            other.metadata,
        )
        assert one.reason == "VERSION_CONFLICT"


def test_refused_connections_are_retried_then_unavailable() -> None:
    with stratad.Client(f"127.0.0.1:{free_port()}", timeout=10) as client:
        counting = count_attempts(client)
        with pytest.raises(errors.UnavailableError, match="failed to connect"):
            client.get_session("s")
        assert counting.attempts == sdk_native.MAX_ATTEMPTS


def test_a_daemon_that_comes_up_during_the_retries_is_reached(
    start_api: Callable[..., Api],
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    started: list[Any] = []
    starter = threading.Timer(0.05, lambda: started.append(start_api(listen=address)))
    with stratad.Client(address, timeout=10) as client:
        counting = count_attempts(client)
        starter.start()
        try:
            # Backoff (jittered) totals up to 0.75 s over 5 attempts; keep trying
            # until the daemon is up, as an agent would.
            deadline = time.monotonic() + 10
            while True:
                try:
                    assert client.create_session("s").session_id == "s"
                    break
                except errors.UnavailableError:
                    assert time.monotonic() < deadline
        finally:
            starter.join()
        assert counting.attempts >= 2  # at least one refused attempt was retried


def test_calls_reconnect_after_the_daemon_restarts(
    start_api: Callable[..., Api], tmp_path: Path
) -> None:
    address = f"127.0.0.1:{free_port()}"
    first = start_api(listen=address, data_dir=tmp_path / "d").server
    with stratad.Client(address) as client:
        client.create_session("s")
        client.save_state("s", b"before")
        first.stop(grace=0)
        start_api(listen=address, data_dir=tmp_path / "d")
        assert client.load_state("s").data == b"before"
        client.save_state("s", b"after")
        assert client.load_state("s").data == b"after"


def test_a_silent_peer_gives_deadline_exceeded_without_retries(black_hole: str) -> None:
    with stratad.Client(black_hole, timeout=0.3) as client:
        counting = count_attempts(client)
        started = time.monotonic()
        with pytest.raises(errors.DeadlineExceededError):
            client.get_session("s")
        assert time.monotonic() - started < 5
        assert counting.attempts == 1  # it may have reached the daemon: never repeated


def test_oversized_requests_are_refused_before_sending(api: Api) -> None:
    with stratad.Client(api.target, max_message_bytes=1 << 10, chunked_uploads=False) as client:
        client.create_session("s")
        counting = count_attempts(client)
        with pytest.raises(errors.ResourceExhaustedError, match="larger than max"):
            client.save_state("s", b"x" * (3 << 20))
        assert counting.attempts == 0


def test_unix_socket_addresses_are_served_natively(
    start_api: Callable[..., Api], tmp_path: Path
) -> None:
    unix = f"unix:{tmp_path / 's.sock'}"
    start_api(listen_unix=unix)
    with stratad.Client(unix) as client:
        assert isinstance(client.sessions.GetSession, sdk_native.UnaryMethod)
        client.create_session("s")
        assert client.get_session("s").session_id == "s"


def test_addresses_only_grpc_resolves_stay_on_grpc(api: Api) -> None:
    port = api.target.rsplit(":", 1)[1]
    with stratad.Client(f"dns:///127.0.0.1:{port}") as client:
        assert not isinstance(client.sessions.GetSession, sdk_native.UnaryMethod)
        client.create_session("s")
        assert client.get_session("s").session_id == "s"


def test_closed_clients_refuse_calls_like_grpc(api: Api) -> None:
    client = stratad.Client(api.target)
    client.close()
    with pytest.raises(ValueError, match="closed channel"):
        client.get_session("s")


def test_the_native_channel_reports_failures_as_statuses(api: Api) -> None:
    channel = native.NativeChannel(api.target, max_receive_bytes=1 << 20)
    request = session_pb2.GetSessionRequest(session_id="missing").SerializeToString()
    response, code, details, trailers, _ = channel.unary(
        "/stratad.api.v1.SessionService/GetSession", request, [], 5.0
    )
    assert (response, code) == (None, grpc.StatusCode.NOT_FOUND.value[0])
    assert "missing" in details
    assert any(key == "grpc-status-details-bin" for key, _ in trailers)
    _, code, details, _, _ = channel.unary("/no.Such/Method", b"", [], 5.0)
    assert code == grpc.StatusCode.UNIMPLEMENTED.value[0]
    with pytest.raises(ValueError, match="timeout"):
        channel.unary("/a.B/C", b"", [], 0.0)
    with pytest.raises(TypeError, match="str or bytes"):
        channel.unary("/a.B/C", b"", [("k", 1)], 1.0)
    with pytest.raises(ValueError, match="address"):
        native.NativeChannel("http://x/y", max_receive_bytes=10)


def test_future_and_with_call_work_as_on_grpc_stubs(api: Api) -> None:
    with stratad.Client(api.target) as client:
        client.create_session("s")
        request = session_pb2.GetSessionRequest(session_id="s")
        future = client.sessions.GetSession.future(request, timeout=5, metadata=client.metadata)
        assert future.result().session.session_id == "s"
        response, call = client.sessions.GetSession.with_call(
            request, timeout=5, metadata=client.metadata
        )
        assert response.session.session_id == "s"
        assert call.code() == grpc.StatusCode.OK


class Interrupted(Exception):
    pass


def test_a_signal_interrupts_a_waiting_call_before_its_deadline(black_hole: str) -> None:
    """Ctrl-C must not wait for the deadline: a waiting call checks for signals."""

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted()

    previous = signal.signal(signal.SIGUSR1, interrupt)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        with stratad.Client(black_hole, timeout=60) as client:
            started = time.monotonic()
            timer.start()
            with pytest.raises(Interrupted):
                client.get_session("s")
            assert time.monotonic() - started < 10
    finally:
        timer.join()
        signal.signal(signal.SIGUSR1, previous)


def test_threads_share_a_client(api: Api) -> None:
    with stratad.Client(api.target) as client:
        client.create_session("s")
        failures: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(30):
                    client.save_state("s", b"%d-%d" % (n, i))
                    assert client.get_session("s").session_id == "s"
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert client.get_session("s").version == 1 + 8 * 30


def test_large_states_go_and_come_back_whole(api: Api) -> None:
    data = os.urandom(12 << 20)
    with stratad.Client(api.target, chunked_uploads=False) as client:
        client.create_session("s")
        client.save_state("s", data)
        assert client.load_state("s").data == data


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_connection(api: Api) -> None:
    with stratad.Client(api.target) as client:
        client.create_session("s")
        assert client._native is not None
        inherited = client._native._channel
        pid = os.fork()
        if pid == 0:  # the child: its calls must work, and leave the parent's alone
            code = 1
            try:
                client.save_state("s", b"from the child")
                code = 0 if client.load_state("s").data == b"from the child" else 2
                # Two processes on one HTTP/2 connection would reuse stream IDs
                # and read each other's answers: the child has its own.
                code = code or (3 if client._native._channel is inherited else 0)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert client.load_state("s").data == b"from the child"
        client.save_state("s", b"from the parent")
        assert client.load_state("s").data == b"from the parent"


def test_an_undecodable_answer_is_internal_not_a_crash(api: Api) -> None:
    def broken(data: bytes) -> Any:
        raise ValueError("not a GetSessionResponse")

    with stratad.Client(api.target) as client:
        client.create_session("s")
        assert client._native is not None
        method = sdk_native.UnaryMethod(
            client._native,
            "/stratad.api.v1.SessionService/GetSession",
            broken,
            client.sessions.GetSession,
        )
        with pytest.raises(errors.InternalError, match="deserializing"):
            client.call(method, session_pb2.GetSessionRequest(session_id="s"))
