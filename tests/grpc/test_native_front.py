"""The native front door (server/front.py, rust/stratad-front) from a client's side.

It serves every listener by default (``front = auto`` without TLS): every
call of every shape, stratad's services, health and reflection alike, with
nothing forwarded. These tests check what a client would notice: the same
answers, statuses and rich error details as grpc.aio, deadlines (also while
a request is still arriving), cancellation, the concurrency limit, oversized
and garbage input, compressed calls and unknown encodings, bad metadata, the
unix socket, and that the daemon keeps serving after each.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import raw_h2
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from stratad.api.v1 import (
    checkpoint_pb2,
    checkpoint_pb2_grpc,
    cognitive_pb2,
    cognitive_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from stratad.config import Config
from stratad.server import front
from stratad.server.app import ServerStartError
from stratad.server.registry import SERVICES
from stratad.server.runner import INLINE_BUDGETS, SAVE_BYTES

DEADLINE = 15.0


def _stubs(target: str, **options: Any) -> tuple[grpc.Channel, Any, Any]:
    channel = grpc.insecure_channel(target, **options)
    return (
        channel,
        session_pb2_grpc.SessionServiceStub(channel),
        checkpoint_pb2_grpc.CheckpointServiceStub(channel),
    )


def _save(checkpoints: Any, session: str, data: bytes, **kw: Any) -> Any:
    request = checkpoint_pb2.SaveStateRequest(session_id=session, data=data)
    return checkpoints.SaveState(request, timeout=kw.pop("timeout", DEADLINE), **kw)


def _load(checkpoints: Any, session: str) -> bytes:
    request = checkpoint_pb2.LoadStateRequest(session_id=session)
    return bytes(checkpoints.LoadState(request, timeout=DEADLINE).data)


@pytest.fixture
def native(inprocess_server: Callable[..., Any]) -> Any:
    server = inprocess_server(SERVICES)
    assert server.server.front is not None, "front = auto must serve TCP natively"
    return server


def test_front_is_native_by_default_and_python_on_request(
    inprocess_server: Callable[..., Any],
) -> None:
    python = inprocess_server(SERVICES, front="python")
    assert python.server.front is None
    assert Config(listen="unix:/tmp/x.sock").native_front


def test_front_python_warns_that_it_lacks_the_edge_limits(
    inprocess_server: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    inprocess_server(SERVICES, front="python")
    warned = [r for r in caplog.records if "without the edge limits" in r.getMessage()]
    assert warned and warned[0].levelname == "WARNING"
    caplog.clear()
    inprocess_server(SERVICES)
    assert not [r for r in caplog.records if "without the edge limits" in r.getMessage()]


def test_saves_and_loads_round_trip_natively(native: Any) -> None:
    channel, sessions, checkpoints = _stubs(native.target)
    with channel:
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="s"), timeout=DEADLINE)
        saved = _save(checkpoints, "s", b'{"step": 1}')
        assert saved.checkpoint_id
        assert _load(checkpoints, "s") == b'{"step": 1}'


def test_health_and_reflection_are_served_natively(native: Any) -> None:
    with grpc.insecure_channel(native.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        answer = next(iter(reflection.ServerReflectionInfo(iter([request]), timeout=DEADLINE)))
        names = {s.name for s in answer.list_services_response.service}
        assert "stratad.api.v1.CheckpointService" in names


def test_server_stream_watch_is_served_natively(native: Any) -> None:
    channel, sessions, checkpoints = _stubs(native.target)
    with channel:
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="w"), timeout=DEADLINE)
        watch = sessions.WatchSession(
            session_pb2.WatchSessionRequest(session_id="w", from_version=1), timeout=DEADLINE
        )
        _save(checkpoints, "w", b"{}")
        answer = next(iter(watch))
        watch.cancel()
        assert answer.event.session_id == "w"


def test_errors_carry_status_and_error_info_like_grpc_aio(
    native: Any, inprocess_server: Callable[..., Any]
) -> None:
    python = inprocess_server(SERVICES, front="python")
    answers = []
    for server in (native, python):
        channel, _, checkpoints = _stubs(server.target)
        with channel, pytest.raises(grpc.RpcError) as caught:
            _load(checkpoints, "no-such-session")
        status = rpc_status.from_call(caught.value)
        assert status is not None
        info = error_details_pb2.ErrorInfo()
        assert status.details[0].Unpack(info)
        answers.append((caught.value.code(), caught.value.details(), info.reason, info.domain))
    assert answers[0] == answers[1]
    assert answers[0][0] == grpc.StatusCode.NOT_FOUND


def test_undecodable_request_is_invalid_argument_and_serving_goes_on(native: Any) -> None:
    with grpc.insecure_channel(native.target) as channel:
        raw = channel.unary_unary("/stratad.api.v1.CheckpointService/SaveState")
        with pytest.raises(grpc.RpcError) as caught:
            raw(b"\xff\xff\xff\xff", timeout=DEADLINE)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        unknown = channel.unary_unary("/stratad.api.v1.CheckpointService/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as caught:
            unknown(b"", timeout=DEADLINE)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    test_saves_and_loads_round_trip_natively(native)


def test_oversized_message_is_resource_exhausted(inprocess_server: Callable[..., Any]) -> None:
    server = inprocess_server(SERVICES, max_message_bytes=1 << 20)
    limit = 1 << 20
    channel, sessions, checkpoints = _stubs(
        server.target, options=[("grpc.max_send_message_length", 64 << 20)]
    )
    with channel:
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="big"), timeout=30)
        with pytest.raises(grpc.RpcError) as caught:
            _save(checkpoints, "big", b"x" * (limit + (8 << 20)))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _save(checkpoints, "big", b"small").checkpoint_id
        assert _load(checkpoints, "big") == b"small"


def _slow_commits(server: Any, seconds: float) -> Callable[[], None]:
    """Make every journaled mutation wait ``seconds`` before its commit; returns undo."""
    committer = server.resources.engine.committer
    original = committer.wait

    async def slow(points: Any, on_durable: Any = None) -> None:
        await asyncio.sleep(seconds)
        await original(points, on_durable)

    committer.wait = slow
    return lambda: setattr(committer, "wait", original)


def test_deadline_exceeded_then_the_save_is_still_durable(native: Any) -> None:
    channel, sessions, checkpoints = _stubs(native.target)
    with channel:
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="d"), timeout=DEADLINE)
        undo = _slow_commits(native, 1.0)
        try:
            with pytest.raises(grpc.RpcError) as caught:
                _save(checkpoints, "d", b'{"late": true}', timeout=0.2)
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        finally:
            undo()
        time.sleep(1.2)
        # grpc.aio's behaviour too: a save past its deadline may still land.
        assert _load(checkpoints, "d") in (b'{"late": true}', b"")
        assert _save(checkpoints, "d", b'{"next": 1}').checkpoint_id
        assert _load(checkpoints, "d") == b'{"next": 1}'
    assert native.server.front._calls == {}


@contextlib.contextmanager
def _loop_held_after_commits(server: Any, after_version: int) -> Iterator[threading.Event]:
    """Hold the event loop, once a mutation to a version past `after_version` is
    durable, until the returned event is set: the call cannot resume (nor
    anything else run on the loop) meanwhile. (An earlier call may still be
    finishing on the loop after its answer: it passes.)"""
    sessions = server.resources.engine.sessions
    original = sessions.announce
    release = threading.Event()

    def held(commit: Any) -> None:
        if any(pending.event.version > after_version for pending in commit):
            release.wait(DEADLINE * 2)
        original(commit)

    sessions.announce = held
    try:
        yield release
    finally:
        release.set()
        sessions.announce = original


def test_a_durable_save_is_answered_before_its_call_resumes(native: Any) -> None:
    """The committer thread answers a save as soon as it is on disk: a client
    gets its answer even while the event loop is stuck after the commit."""
    channel, sessions, checkpoints = _stubs(native.target)
    with channel:
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="e"), timeout=DEADLINE)
        first = _save(checkpoints, "e", b'{"step": 1}')
        with _loop_held_after_commits(native, first.version) as release:
            saved = _save(checkpoints, "e", b'{"step": 2}', timeout=DEADLINE)
            release.set()
        with _loop_held_after_commits(native, saved.version) as release:
            written = checkpoints.PutWrites(
                checkpoint_pb2.PutWritesRequest(
                    session_id="e",
                    checkpoint_id=saved.checkpoint_id,
                    task_id="t",
                    writes=[checkpoint_pb2.WriteValue(idx=0, channel="c", value=b"v")],
                ),
                timeout=DEADLINE,
            )
            release.set()
        assert saved.version == first.version + 1
        assert saved.checkpoint_id != first.checkpoint_id
        assert written.stored == 1 and written.version == saved.version + 1
        assert _load(checkpoints, "e") == b'{"step": 2}'
    assert native.server.front._calls == {}


def test_a_durable_structured_update_is_answered_before_its_call_resumes(native: Any) -> None:
    """As saves: a cognitive-state update is answered from the committer thread."""
    channel, sessions, _ = _stubs(native.target)
    with channel:
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="u"), timeout=DEADLINE)
        cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(channel)
        started = cognitive.Initialize(
            cognitive_pb2.InitializeRequest(session_id="u", goal="ship"), timeout=DEADLINE
        )
        with _loop_held_after_commits(native, started.version) as release:
            recorded = cognitive.RecordDecision(
                cognitive_pb2.RecordDecisionRequest(session_id="u", step=1, decision="d"),
                timeout=DEADLINE,
            )
            release.set()
        assert recorded.decision.decision == "d"
        assert recorded.version == started.version + 1
        state = cognitive.GetCognitiveState(
            cognitive_pb2.GetCognitiveStateRequest(session_id="u"), timeout=DEADLINE
        )
        assert [d.decision for d in state.state.insights.decision_log] == ["d"]


def _save_in_flight(checkpoints: Any, session: str) -> Any:
    """Start a save (its commit held up by `_slow_commits`) and let it reach the daemon."""
    future = checkpoints.SaveState.future(
        checkpoint_pb2.SaveStateRequest(session_id=session, data=b"{}"), timeout=DEADLINE
    )
    time.sleep(0.3)
    return future


def test_client_cancel_ends_the_call_and_serving_goes_on(native: Any) -> None:
    channel, sessions, checkpoints = _stubs(native.target)
    with channel:
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="c"), timeout=DEADLINE)
        # Held far longer than the wait below: the call can only leave the
        # front door's table because the cancellation reached its handler.
        undo = _slow_commits(native, 60.0)
        try:
            assert _save_in_flight(checkpoints, "c").cancel()
        finally:
            undo()
        deadline = time.monotonic() + 10
        while native.server.front._calls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert native.server.front._calls == {}
        assert _save(checkpoints, "c", b'{"after": 1}').checkpoint_id


def test_concurrent_call_limit(inprocess_server: Callable[..., Any]) -> None:
    """With every slot taken, a call waits for one (up to 1 s, rpc.rs SLOT_WAIT):
    refused RESOURCE_EXHAUSTED if none frees by then, served if one does."""
    server = inprocess_server(SERVICES, max_concurrent_rpcs=1)
    channel, sessions, checkpoints = _stubs(server.target)
    with channel:
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="l"), timeout=DEADLINE)
        undo = _slow_commits(server, 4.0)
        try:
            first = _save_in_flight(checkpoints, "l")
            with pytest.raises(grpc.RpcError) as caught:
                _save(checkpoints, "l", b"{}")
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert first.result().checkpoint_id
        finally:
            undo()
        undo = _slow_commits(server, 0.5)
        try:
            first = _save_in_flight(checkpoints, "l")  # holds the slot ~0.2 s more
            assert _save(checkpoints, "l", b"{}").checkpoint_id  # waited, then served
            assert first.result().checkpoint_id
        finally:
            undo()


def test_compressed_calls_are_served(native: Any) -> None:
    channel, sessions, checkpoints = _stubs(native.target, compression=grpc.Compression.Gzip)
    with channel:
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="z"), timeout=DEADLINE)
        _save(checkpoints, "z", b'{"zipped": "' + b"a" * 4096 + b'"}')
        assert _load(checkpoints, "z").startswith(b'{"zipped"')


def test_savestates_stream_answers_in_order(native: Any) -> None:
    channel, sessions, checkpoints = _stubs(native.target)
    with channel:
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="st"), timeout=DEADLINE)
        requests = [
            checkpoint_pb2.SaveStatesRequest(
                request=checkpoint_pb2.SaveStateRequest(
                    session_id="st", data=b'{"i": %d}' % i, checkpoint_id=f"cp-{i}"
                )
            )
            for i in range(50)
        ]
        answers = list(checkpoints.SaveStates(iter(requests), timeout=DEADLINE))
        assert [a.response.checkpoint_id for a in answers] == [f"cp-{i}" for i in range(50)]
        assert _load(checkpoints, "st") == b'{"i": 49}'


def test_garbage_on_the_port_does_not_stop_serving(native: Any) -> None:
    host, _, port = native.target.rpartition(":")
    for garbage in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 64, b"PRI * HTTP/2.0\r\n"):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(garbage)
            sock.settimeout(2)
            with contextlib.suppress(TimeoutError):
                sock.recv(1024)
    test_saves_and_loads_round_trip_natively(native)


def test_many_clients_at_once(native: Any) -> None:
    channel, sessions, checkpoints = _stubs(native.target)
    errors: list[BaseException] = []

    def client(n: int) -> None:
        try:
            session = f"m{n}"
            sessions.CreateSession(
                session_pb2.CreateSessionRequest(session_id=session), timeout=DEADLINE
            )
            for i in range(20):
                _save(checkpoints, session, b'{"n": %d, "i": %d}' % (n, i))
            assert _load(checkpoints, session) == b'{"n": %d, "i": 19}' % n
        except BaseException as exc:
            errors.append(exc)

    with channel:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def _until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_stream_read_ahead_is_charged_and_given_back(inprocess_server: Callable[..., Any]) -> None:
    """Requests a stream reads ahead of its handler are decoded and charged to the
    in-flight budget as they arrive, and a cancelled stream gives every charge back."""
    server = inprocess_server(SERVICES, max_inflight_bytes=64 << 20)
    budget = server.resources.budget
    channel, sessions, checkpoints = _stubs(server.target)
    # Small enough that any batch of them is saved on the event loop, where the
    # held commit holds it (a batch over the SAVE_BYTES budget goes to a worker and
    # fsyncs there, not held: the rest would then be answered, not read ahead).
    size, count = 8_000, 10
    assert size * count <= INLINE_BUDGETS[SAVE_BYTES].limit
    with channel:
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="ra"), timeout=DEADLINE)
        undo = _slow_commits(server, 60.0)  # the first save holds; the rest wait read ahead
        try:
            items = [
                checkpoint_pb2.SaveStatesRequest(
                    request=checkpoint_pb2.SaveStateRequest(session_id="ra", data=os.urandom(size))
                )
                for _ in range(count)
            ]
            stream = checkpoints.SaveStates(iter(items), timeout=DEADLINE)
            _until(lambda: budget.in_use >= 6 * size * count, "every item to be charged")
            stream.cancel()
            _until(lambda: budget.in_use == 0, "the charges to be given back")
            _until(lambda: server.server.front._calls == {}, "the call to end")
        finally:
            undo()
        assert _save(checkpoints, "ra", b"after").checkpoint_id
    # Answered from the committer thread once durable: its charge is given back
    # when the call ends on the event loop, just after the client has its answer.
    _until(lambda: budget.in_use == 0, "the last save's charge to be given back")


def test_a_request_whose_decoding_raises_is_raised_where_the_handler_reads_it() -> None:
    """Decoding happens as messages arrive, in the front door's event handler: a
    deserializer that raises must not break that handler (every call's events
    go through it), only the stream whose request it was."""
    from types import SimpleNamespace

    def broken(data: bytes) -> Any:
        raise ValueError(f"cannot decode {data!r}")

    active = front._Active(SimpleNamespace(request_streaming=True), False)
    active.decode = broken
    active.arrived(b"x", False)
    active.decode = bytes.upper
    active.arrived(b"y", True)
    assert active.inbox is not None
    (first, _), second = active.inbox.get_nowait(), active.inbox.get_nowait()
    assert isinstance(first, front._Undecoded) and "cannot decode b'x'" in str(first.error)
    assert second == (b"Y", True)


# --- the edge: what raw HTTP/2 clients send (tests/grpc/raw_h2.py) -------------------

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
SAVE_STATE = "/stratad.api.v1.CheckpointService/SaveState"
SAVE_STATES = "/stratad.api.v1.CheckpointService/SaveStates"


def _healthy(target: str) -> None:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=DEADLINE
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(SAVE_STATE, None, id="unary-body-never-sent"),
        pytest.param(SAVE_STATE, raw_h2.frame(b"x" * 100)[:40], id="unary-body-stops-half-way"),
        pytest.param(SAVE_STATES, None, id="quiet-stream"),
    ],
)
def test_a_call_whose_requests_do_not_come_ends_at_its_deadline(
    native: Any, path: str, body: bytes | None
) -> None:
    timeout = [(b"grpc-timeout", b"300m")]
    answer = raw_h2.call(native.target, path, headers=timeout, body=body, end=False, timeout=5)
    assert answer.status == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], answer
    assert answer.seconds < 2.0
    _until(lambda: native.server.front._calls == {}, "the daemon to drop the call")
    _healthy(native.target)


def test_an_unknown_encoding_is_unimplemented_and_later_calls_are_unaffected(
    native: Any,
) -> None:
    """Once, one such request made every later call carrying the header fail
    INTERNAL, from any client (a forwarding connection's header table)."""
    for _ in range(2):
        answer = raw_h2.call(
            native.target, HEALTH_CHECK, headers=[(b"grpc-encoding", b"br")], body=raw_h2.frame(b"")
        )
        assert answer.status == grpc.StatusCode.UNIMPLEMENTED.value[0], answer
        assert "br" in answer.message
        assert "gzip" in answer.headers["grpc-accept-encoding"]
    gzip = raw_h2.call(
        native.target, HEALTH_CHECK, headers=[(b"grpc-encoding", b"gzip")], body=raw_h2.frame(b"")
    )
    assert gzip.status == 0, gzip
    _healthy(native.target)


@pytest.mark.parametrize(
    ("header", "value", "code"),
    [
        (b"x-stratad-tenant", "café".encode(), grpc.StatusCode.INVALID_ARGUMENT),
        (b"x-request-id", b"\xff\xfe", grpc.StatusCode.INVALID_ARGUMENT),
        (b"trace-bin", b"!!not base64!!", grpc.StatusCode.INVALID_ARGUMENT),
        (b"grpc-timeout", b"abc", grpc.StatusCode.INTERNAL),  # as grpc-go answers
        (b"grpc-timeout", b"123456789S", grpc.StatusCode.OK),  # 9 digits: far away
    ],
)
def test_malformed_metadata_gets_a_clear_status(
    native: Any, header: bytes, value: bytes, code: grpc.StatusCode
) -> None:
    answer = raw_h2.call(
        native.target, HEALTH_CHECK, headers=[(header, value)], body=raw_h2.frame(b"")
    )
    assert answer.status == code.value[0], answer
    if code != grpc.StatusCode.OK:
        assert header.decode() in answer.message
    _healthy(native.target)


def test_answers_list_the_accepted_encodings_and_unknown_methods_are_unimplemented(
    native: Any,
) -> None:
    ok = raw_h2.call(native.target, HEALTH_CHECK, body=raw_h2.frame(b""))
    assert ok.status == 0 and ok.headers["grpc-accept-encoding"] == "identity,deflate,gzip"
    for path in ("/no.Such/Method", "/stratad.api.v1.CheckpointService/NoSuchMethod"):
        missing = raw_h2.call(native.target, path, body=raw_h2.frame(b""))
        assert missing.status == grpc.StatusCode.UNIMPLEMENTED.value[0], missing


def test_the_unix_socket_beside_the_front_door_serves_every_call(
    inprocess_server: Callable[..., Any], tmp_path: Any
) -> None:
    """The native front door serves it too (grpcio sends the socket's path as
    `:authority`, which rust/stratad-front/src/unix.rs re-encodes for h2)."""
    path = tmp_path / "stratad.sock"
    server = inprocess_server(SERVICES, listen_unix=f"unix:{path}")
    assert server.server.front is not None
    assert server.server.addresses[1] == f"unix:{path}"
    channel, sessions, checkpoints = _stubs(f"unix:{path}")
    with channel:
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="u"), timeout=DEADLINE)
        _save(checkpoints, "u", b'{"over": "unix"}')
        assert _load(checkpoints, "u") == b'{"over": "unix"}'
    _healthy(f"unix:{path}")
    with grpc.insecure_channel(native_target := server.target) as tcp:
        assert native_target != f"unix:{path}"
        request = checkpoint_pb2.LoadStateRequest(session_id="u")
        loaded = checkpoint_pb2_grpc.CheckpointServiceStub(tcp).LoadState(request, timeout=DEADLINE)
        assert loaded.data == b'{"over": "unix"}'


def test_the_unix_socket_file_is_replaced_when_stale_and_removed_at_stop(
    inprocess_server: Callable[..., Any], tmp_path: Any
) -> None:
    """A socket left by a daemon that was killed is replaced at start; the file
    goes when the daemon stops; any other file at the path is never removed."""
    path = tmp_path / "stratad.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # bound, not listening: what a SIGKILLed daemon leaves
    stale.close()
    server = inprocess_server(SERVICES, listen_unix=f"unix:{path}")
    _healthy(f"unix:{path}")
    server.stop(grace=0)
    assert not path.exists()
    path.write_text("not a socket")
    with pytest.raises(ServerStartError, match=str(path)):
        inprocess_server(SERVICES, listen_unix=f"unix:{path}")
    assert path.read_text() == "not a socket"


def test_no_private_socket_is_left_behind(
    inprocess_server: Callable[..., Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The front door once forwarded calls to grpc.aio on a private unix socket
    in a `stratad-front-*` directory, which a SIGKILLed daemon left behind
    forever; with nothing forwarded there is no such socket."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    server = inprocess_server(SERVICES)
    _healthy(server.target)
    assert server.server.front is not None
    assert list(tmp_path.glob("stratad-front-*")) == []
