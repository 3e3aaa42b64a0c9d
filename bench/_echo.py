"""A bare grpc.aio echo server: the baseline every gRPC benchmark is compared with.

Methods `/bench.Echo/Unary` and `/bench.Echo/Stream` (bidi) take raw bytes and
answer with a 64-byte reply, like a SaveStateResponse, with no work at all.
It also serves the standard health service so benchmarks can wait for it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

REPLY = b"x" * 64


def _identity(data: bytes) -> bytes:
    return data


async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return REPLY


async def stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
) -> AsyncIterator[bytes]:
    async for _ in requests:
        yield REPLY


async def main(address: str, reuseport: bool) -> None:
    # --reuseport: several echo processes share one port (bench/front.py).
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.so_reuseport", int(reuseport)),
        ]
    )
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, _identity, _identity),
        "Stream": grpc.stream_stream_rpc_method_handler(stream, _identity, _identity),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", handlers),))
    health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
    server.add_insecure_port(address)
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], "--reuseport" in sys.argv[2:]))
