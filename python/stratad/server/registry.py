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
import os
import socket
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from stratad.config import Config
from stratad.domain.engine import Engine
from stratad.domain.quotas import Quotas
from stratad.server.limits import InflightBudget
from stratad.store.crypto import keyring_from_settings
from stratad.store.datadir import DataDir, open_data_dir
from stratad.store.remote import RemoteTier

#: Worker threads for blocking domain work. Native work releases the GIL and
#: journal fsyncs of concurrent writers overlap, so this is sized for I/O
#: concurrency rather than for the (two) cores.
WORKER_THREADS = 32


@dataclass(frozen=True, slots=True)
class Resources:
    """Everything a servicer is built from."""

    config: Config
    data_dir: DataDir
    #: The domain layer over the data directory.
    engine: Engine
    #: Where servicers run blocking domain work, off the event loop.
    executor: ThreadPoolExecutor
    #: Memory budget of the requests in flight (None: max_inflight_bytes = 0).
    budget: InflightBudget | None = None
    #: Set when shutdown begins. Long-lived streams (watches) should end when
    #: it is set, or graceful shutdown waits out the whole grace period.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.asynccontextmanager
async def open_resources(config: Config) -> AsyncIterator[Resources]:
    """Open what the daemon owns for its lifetime, and release it on exit."""
    with open_data_dir(config.data_dir) as data_dir:
        keyring = (
            keyring_from_settings(
                config.encryption_key_file,
                config.encryption_old_key_files,
                dict(os.environ),
                data_dir.path,
            )
            if config.encryption == "on"
            else None
        )
        engine = Engine(
            data_dir.path,
            durability=config.durability,
            fsync_interval=config.fsync_interval_ms / 1000,
            max_state_bytes=config.max_message_bytes,
            quotas=Quotas(
                tenant_stored_bytes=config.max_tenant_stored_bytes,
                tenant_sessions=config.max_tenant_sessions,
                session_checkpoints=config.max_session_checkpoints,
            ),
            keyring=keyring,
        )
        if config.replication != "off":
            engine.replicate_to(
                RemoteTier.from_url(config.remote_url),
                mode=config.replication,
                node_id=config.node_id or default_node_id(),
                lag=config.replication_lag_ms / 1000,
                lease=config.replication_lease_ms / 1000,
                gc_grace=config.replication_gc_grace_seconds,
            )
        engine.open()  # recovery: replay journals, cut torn tails, restore objects
        executor = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="stratad-worker")
        budget = InflightBudget(config.max_inflight_bytes) if config.max_inflight_bytes else None
        try:
            yield Resources(
                config=config, data_dir=data_dir, engine=engine, executor=executor, budget=budget
            )
        finally:
            executor.shutdown(wait=True)
            engine.close()


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
    # Imported here: the servicers import this module for `Resources`.
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
    from stratad.server.servicers.admin import AdminServicer
    from stratad.server.servicers.agent import AgentStateServicer
    from stratad.server.servicers.checkpoint import CheckpointServicer
    from stratad.server.servicers.cognitive import CognitiveStateServicer
    from stratad.server.servicers.crystal import CrystalServicer
    from stratad.server.servicers.profile import ProfileServicer
    from stratad.server.servicers.session import SessionServicer
    from stratad.server.servicers.task import TaskServicer

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


def default_node_id() -> str:
    """The host name and PID: unique among the daemons sharing a bucket."""
    return f"{socket.gethostname()}-{os.getpid()}"
