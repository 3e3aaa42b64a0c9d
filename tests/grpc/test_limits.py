"""The in-flight memory budget (max_inflight_bytes), through the real server.

The budget is occupied from the test (`hold`) where a test needs a busy
daemon: that is deterministic, unlike racing real requests.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc
import pytest
import test_error_interceptor as interceptor_tests
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stratad.api.v1 import checkpoint_pb2
from stratad.errors import ERROR_DOMAIN
from stratad.sdk.client import error_info
from stratad.server.limits import (
    DECODED_FACTOR,
    MEMORY_FACTOR,
    InflightBudget,
    _charging_deserializer,
)

if TYPE_CHECKING:
    from conftest import Api

BUDGET = 4 << 20


@pytest.fixture
def limited(start_api: Callable[..., Api]) -> Api:
    return start_api(max_inflight_bytes=BUDGET)


def budget_of(api: Api) -> InflightBudget:
    budget = api.server.resources.budget
    assert budget is not None
    return budget


def wait_released(budget: InflightBudget, expected: int = 0) -> None:
    """Charges are released as calls end, which the client may see a moment earlier."""
    deadline = time.monotonic() + 10
    while budget.in_use != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert budget.in_use == expected


def assert_overloaded(error: Any) -> None:
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert "max_inflight_bytes" in error.details()
    info = error_info(error)
    assert info is not None
    assert (info.domain, info.reason) == (ERROR_DOMAIN, "OVERLOADED")
    assert info.metadata["limit"] == "max_inflight_bytes"
    assert info.metadata["limit_bytes"] == str(BUDGET)


def test_a_request_that_does_not_fit_is_refused_and_changes_nothing(limited: Api) -> None:
    budget = budget_of(limited)
    limited.create("s")
    limited.save("s", b"before")
    assert budget.try_acquire(BUDGET - 1000)  # another call holds nearly all of it
    try:
        details = limited.fails(
            limited.checkpoints.SaveState,
            checkpoint_pb2.SaveStateRequest(session_id="s", data=b"x" * 10_000),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "overloaded",
            "max_inflight_bytes",
        )
        assert "retry" in details
        with pytest.raises(grpc.RpcError) as raised:
            limited.save("s", b"y" * 10_000)
        assert_overloaded(raised.value)
        assert limited.load("s").data == b"before"
    finally:
        budget.release(BUDGET - 1000)
    limited.save("s", b"after")  # retried once the budget is free: it goes through
    assert limited.load("s").data == b"after"
    wait_released(budget)


def test_small_requests_still_fit_beside_a_busy_budget(limited: Api) -> None:
    budget = budget_of(limited)
    limited.create("s")
    assert budget.try_acquire(BUDGET // 2)
    try:
        limited.save("s", b"small")
        assert limited.load("s").data == b"small"
    finally:
        budget.release(BUDGET // 2)
    wait_released(budget)


def test_a_request_alone_is_admitted_even_over_the_budget(limited: Api) -> None:
    """The largest message allowed must always be servable on an idle daemon."""
    budget = budget_of(limited)
    limited.create("s")
    big = b"z" * (BUDGET // MEMORY_FACTOR + 4096)  # charged more than the whole budget
    limited.save("s", big)
    assert limited.load("s").data == big
    wait_released(budget)


def test_charges_are_released_after_errors_and_malformed_requests(limited: Api) -> None:
    budget = budget_of(limited)
    limited.fails(
        limited.checkpoints.SaveState,
        checkpoint_pb2.SaveStateRequest(session_id="missing", data=b"x" * 5000),
        grpc.StatusCode.NOT_FOUND,
    )
    raw = limited.channel.unary_unary("/stratad.api.v1.CheckpointService/SaveState")
    with pytest.raises(grpc.RpcError) as raised:
        raw(b"\xff\xff\xff", timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    wait_released(budget)


def test_a_cancelled_call_gives_its_charge_back(limited: Api) -> None:
    budget = budget_of(limited)
    limited.create("s")
    requests: queue.Queue[checkpoint_pb2.SaveStatesRequest | None] = queue.Queue()

    def items() -> Iterator[checkpoint_pb2.SaveStatesRequest]:
        while (item := requests.get()) is not None:
            yield item

    call = limited.checkpoints.SaveStates(items(), metadata=limited.metadata, timeout=30)
    requests.put(item_request("s", b"a" * 10_000))
    next(call)  # answered: held by the server no longer
    call.cancel()
    requests.put(None)
    wait_released(budget)


def item_request(session_id: str, data: bytes) -> checkpoint_pb2.SaveStatesRequest:
    return checkpoint_pb2.SaveStatesRequest(
        request=checkpoint_pb2.SaveStateRequest(session_id=session_id, data=data)
    )


class Conversation:
    """A SaveStates stream driven one item at a time: send, then read its answer."""

    def __init__(self, api: Api) -> None:
        self._requests: queue.Queue[checkpoint_pb2.SaveStatesRequest | None] = queue.Queue()
        self._call = api.checkpoints.SaveStates(self._items(), metadata=api.metadata, timeout=30)

    def _items(self) -> Iterator[checkpoint_pb2.SaveStatesRequest]:
        while (item := self._requests.get()) is not None:
            yield item

    def send(self, item: checkpoint_pb2.SaveStatesRequest) -> checkpoint_pb2.SaveStatesResponse:
        self._requests.put(item)
        return next(self._call)

    def close(self) -> None:
        self._requests.put(None)
        assert list(self._call) == []


def test_a_stream_item_holds_its_charge_only_until_its_answer(limited: Api) -> None:
    """Many items in one stream, more than the budget together: each fits alone."""
    budget = budget_of(limited)
    limited.create("s")
    size = BUDGET // MEMORY_FACTOR // 2  # two items would fit, not three
    stream = Conversation(limited)
    # Another call keeps the budget busy, so a lone item is not simply admitted.
    assert budget.try_acquire(size)
    try:
        for i in range(8):
            response = stream.send(item_request("s", bytes([i]) * size))
            assert response.HasField("response"), response.error.message
        stream.close()
    finally:
        budget.release(size)
    assert limited.load("s").data == bytes([7]) * size
    wait_released(budget)


def test_a_stream_item_that_does_not_fit_ends_the_stream_after_earlier_answers(
    limited: Api,
) -> None:
    budget = budget_of(limited)
    limited.create("s")
    stream = Conversation(limited)
    first = stream.send(item_request("s", b"first"))
    assert first.HasField("response")
    assert budget.try_acquire(BUDGET)  # now the daemon is busy
    try:
        with pytest.raises(grpc.RpcError) as raised:
            stream.send(item_request("s", b"second" * 1000))
        assert_overloaded(raised.value)
    finally:
        budget.release(BUDGET)
        stream._requests.put(None)
    assert limited.load("s").data == b"first"
    wait_released(budget)


def test_a_chunked_upload_is_charged_for_the_state_it_declares(limited: Api) -> None:
    """Compressed frames are small on the wire; decoding them is not."""
    budget = budget_of(limited)
    limited.create("s")
    declared = BUDGET  # a few KiB of frames declaring 4 MiB
    request = checkpoint_pb2.SaveStateRequest(
        session_id="s",
        chunked=checkpoint_pb2.ChunkedState(size=declared, digest="0" * 64),
    )
    assert budget.try_acquire(1)
    try:
        with pytest.raises(grpc.RpcError) as raised:
            limited.call(limited.checkpoints.SaveState, request)
        assert_overloaded(raised.value)
        charged = int(error_info(raised.value).metadata["request_bytes"])  # type: ignore[union-attr]
        assert charged >= DECODED_FACTOR * declared
    finally:
        budget.release(1)
    wait_released(budget)


def test_without_a_budget_nothing_is_charged(start_api: Callable[..., Api]) -> None:
    api = start_api(max_inflight_bytes=0)
    assert api.server.resources.budget is None
    api.create("s")
    api.save("s", b"x" * 100_000)


def test_concurrent_calls_share_the_budget_without_leaking(limited: Api) -> None:
    budget = budget_of(limited)
    for i in range(8):
        limited.create(f"s{i}")
    errors: list[BaseException] = []

    def saves(i: int) -> None:
        for n in range(10):
            try:
                limited.save(f"s{i}", bytes([n]) * 50_000)
            except grpc.RpcError as exc:  # OVERLOADED is allowed under contention
                if error_info(exc) is None or error_info(exc).reason != "OVERLOADED":  # type: ignore[union-attr]
                    errors.append(exc)

    threads = [threading.Thread(target=saves, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    wait_released(budget)


def test_health_checks_are_never_refused(limited: Api) -> None:
    """Probes must see a busy daemon as alive, or Kubernetes restarts it."""
    budget = budget_of(limited)
    assert budget.try_acquire(10 * BUDGET)  # a lone request far over the budget
    try:
        stub = health_pb2_grpc.HealthStub(limited.channel)
        for service in ("", "stratad.writes"):
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        budget.release(10 * BUDGET)


def test_budget_admits_what_fits_and_a_request_alone() -> None:
    budget = InflightBudget(100)
    assert budget.try_acquire(500)  # alone: admitted over the budget
    assert not budget.try_acquire(1)
    budget.release(500)
    assert budget.try_acquire(60)
    assert budget.try_acquire(40)
    assert not budget.try_acquire(1)
    # A request charged again once decoded is alone if it holds all that is in use.
    budget.release(40)
    assert budget.try_acquire(500, holding=60)
    assert budget.in_use == 560


def test_a_charge_is_released_when_its_request_is_dropped_unhandled() -> None:
    """A call cancelled between decoding and its handler must not leak its charge."""
    budget = InflightBudget(1000)
    deserialize = _charging_deserializer(checkpoint_pb2.SaveStateRequest.FromString, budget)
    held = deserialize(checkpoint_pb2.SaveStateRequest(session_id="s").SerializeToString())
    assert budget.in_use > 0
    del held
    assert budget.in_use == 0


@pytest.mark.parametrize("method", list(interceptor_tests.METHODS))
def test_every_handler_kind_is_charged_refused_and_released(
    inprocess_server: Callable[..., Any], method: str
) -> None:
    """Sync and async, unary and streaming, writer style: the test service of
    test_error_interceptor.py behind the real interceptor chain."""
    # grpc.aio runs plain-function handlers on a thread pool; the native front
    # door serves async handlers only (server/front.py).
    front = "python" if method.endswith("Sync") else "auto"
    server = inprocess_server(
        services=[interceptor_tests.registration()], max_inflight_bytes=BUDGET, front=front
    )
    budget = server.resources.budget
    with grpc.insecure_channel(server.target) as channel:
        for payload in (b"ok", b"NotFoundError", b"undecodable"):
            interceptor_tests.collect(channel, method, payload)
        wait_released(budget)
        assert budget.try_acquire(BUDGET)
        try:
            received, error = interceptor_tests.collect(channel, method, b"ok")
            assert received == [] and error is not None
            assert_overloaded(error)
        finally:
            budget.release(BUDGET)
        wait_released(budget)
