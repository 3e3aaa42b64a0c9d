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

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from stratad.api.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    agent_pb2,
    agent_pb2_grpc,
    checkpoint_pb2,
    checkpoint_pb2_grpc,
    cognitive_pb2,
    cognitive_pb2_grpc,
    crystal_pb2,
    crystal_pb2_grpc,
    profile_pb2,
    profile_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    task_pb2,
    task_pb2_grpc,
)
from stratad.server.resources import Resources, open_resources
from stratad.server.servicers.admin import AdminServicer
from stratad.server.servicers.agent import AgentStateServicer
from stratad.server.servicers.checkpoint import CheckpointServicer
from stratad.server.servicers.cognitive import CognitiveStateServicer
from stratad.server.servicers.crystal import CrystalServicer
from stratad.server.servicers.profile import ProfileServicer
from stratad.server.servicers.session import SessionServicer
from stratad.server.servicers.task import TaskServicer


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


def _services() -> tuple[ServiceRegistration, ...]:

    return (
        ServiceRegistration(
            service_name(session_pb2, "SessionService"),
            session_pb2_grpc.add_SessionServiceServicer_to_server,
            SessionServicer,
        ),
        ServiceRegistration(
            service_name(checkpoint_pb2, "CheckpointService"),
            checkpoint_pb2_grpc.add_CheckpointServiceServicer_to_server,
            CheckpointServicer,
        ),
        ServiceRegistration(
            service_name(admin_pb2, "AdminService"),
            admin_pb2_grpc.add_AdminServiceServicer_to_server,
            AdminServicer,
        ),
        ServiceRegistration(
            service_name(cognitive_pb2, "CognitiveStateService"),
            cognitive_pb2_grpc.add_CognitiveStateServiceServicer_to_server,
            CognitiveStateServicer,
        ),
        ServiceRegistration(
            service_name(task_pb2, "TaskService"),
            task_pb2_grpc.add_TaskServiceServicer_to_server,
            TaskServicer,
        ),
        ServiceRegistration(
            service_name(agent_pb2, "AgentStateService"),
            agent_pb2_grpc.add_AgentStateServiceServicer_to_server,
            AgentStateServicer,
        ),
        ServiceRegistration(
            service_name(profile_pb2, "ProfileService"),
            profile_pb2_grpc.add_ProfileServiceServicer_to_server,
            ProfileServicer,
        ),
        ServiceRegistration(
            service_name(crystal_pb2, "CrystalService"),
            crystal_pb2_grpc.add_CrystalServiceServicer_to_server,
            CrystalServicer,
        ),
    )


#: Every application service the daemon serves (health and reflection are
#: added by `start_server` itself).
SERVICES: tuple[ServiceRegistration, ...] = _services()


__all__ = ["SERVICES", "Resources", "ServiceRegistration", "open_resources", "service_name"]
