"""The services stratad serves: the one place a new servicer is registered.

A later service adds one `ServiceRegistration` to `SERVICES`, for example::

    from stratad.api.v1 import session_pb2, session_pb2_grpc
    from stratad.server.servicers.session import SessionServicer

    SERVICES = (
        ServiceRegistration(
            name=service_name(session_pb2, "SessionService"),
            add_fn=session_pb2_grpc.add_SessionServiceServicer_to_server,
            servicer_factory=SessionServicer,  # called as SessionServicer(resources)
        ),
    )

`start_server` then builds the servicer, adds it to the server, lists it in
reflection and reports it SERVING on the health service.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from stratad.config import Config
from stratad.store.datadir import DataDir, open_data_dir


@dataclass(frozen=True, slots=True)
class Resources:
    """Everything a servicer is built from. Later issues add the store here."""

    config: Config
    data_dir: DataDir
    #: Set when shutdown begins. Long-lived streams (watches) should end when
    #: it is set, or graceful shutdown waits out the whole grace period.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.asynccontextmanager
async def open_resources(config: Config) -> AsyncIterator[Resources]:
    """Open what the daemon owns for its lifetime, and release it on exit."""
    with open_data_dir(config.data_dir) as data_dir:
        yield Resources(config=config, data_dir=data_dir)


@dataclass(frozen=True, slots=True)
class ServiceRegistration:
    """One gRPC service: its full name, how to add it, how to build its servicer."""

    #: Full service name, e.g. "stratad.api.v1.SessionService"; see `service_name`.
    name: str
    #: ``add_XServicer_to_server(servicer, server)`` from the generated *_pb2_grpc module.
    add_fn: Callable[[Any, Any], None]
    #: Builds the servicer from the daemon's resources.
    servicer_factory: Callable[[Resources], object]


def service_name(pb2_module: ModuleType, service: str) -> str:
    """The full name of ``service`` as declared in a generated *_pb2 module."""
    return str(pb2_module.DESCRIPTOR.services_by_name[service].full_name)


#: Every application service the daemon serves (health and reflection are
#: added by `start_server` itself).
SERVICES: tuple[ServiceRegistration, ...] = ()


__all__ = ["SERVICES", "Resources", "ServiceRegistration", "open_resources", "service_name"]
