"""Graceful shutdown: NOT_SERVING first, then in-flight calls drain."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from stratad.server.registry import Resources, ServiceRegistration

SERVICE = "stratad.test.v1.SlowService"


class Slow:
    """Holds each call until shutdown begins, then reports the health it sees."""

    def __init__(self, resources: Resources) -> None:
        self.resources = resources
        self.health: Any = None  # set by the test once the server is up
        self.entered = threading.Event()

    async def wait_for_shutdown(self, request: bytes, context: Any) -> bytes:
        self.entered.set()
        await self.resources.stopping.wait()
        response = await self.health.Check(health_pb2.HealthCheckRequest(service=""), context)
        name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
        return name.encode()


def registration(instances: list[Slow]) -> ServiceRegistration:
    def factory(resources: Resources) -> Slow:
        instances.append(Slow(resources))
        return instances[-1]

    def add(servicer: Slow, server: Any) -> None:
        method = grpc.unary_unary_rpc_method_handler(servicer.wait_for_shutdown)
        handler = grpc.method_handlers_generic_handler(SERVICE, {"Wait": method})
        server.add_generic_rpc_handlers((handler,))
        server.add_registered_method_handlers(SERVICE, {"Wait": method})

    return ServiceRegistration(name=SERVICE, add_fn=add, servicer_factory=factory)


def test_in_flight_call_drains_after_not_serving(inprocess_server: Callable[..., Any]) -> None:
    instances: list[Slow] = []
    server = inprocess_server(services=[registration(instances)])
    slow = instances[0]
    slow.health = server.server.health

    with grpc.insecure_channel(server.target) as channel, ThreadPoolExecutor(1) as pool:
        call = pool.submit(channel.unary_unary(f"/{SERVICE}/Wait"), b"", timeout=30)
        assert slow.entered.wait(timeout=10), "call never reached the handler"
        server.stop(grace=10)
        # The call was in flight when shutdown began: it finishes normally, and
        # by then health already said NOT_SERVING.
        assert call.result(timeout=10) == b"NOT_SERVING"


def test_new_calls_are_refused_after_stop(inprocess_server: Callable[..., Any]) -> None:
    server = inprocess_server()
    target = server.target
    server.stop(grace=1)
    with grpc.insecure_channel(target) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        with pytest.raises(grpc.RpcError) as excinfo:
            check(b"", timeout=2)
    assert excinfo.value.code() == grpc.StatusCode.UNAVAILABLE


def test_data_dir_is_released_after_stop(inprocess_server: Callable[..., Any]) -> None:
    server = inprocess_server()
    data_dir = server.resources.data_dir
    server.stop(grace=0)
    assert data_dir.closed
