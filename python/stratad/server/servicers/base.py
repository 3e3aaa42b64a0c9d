"""What every servicer shares: the tenant of a call, its answer budget, the runner."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from stratad.server.auth import (
    DEFAULT_TENANT,
    TENANT_METADATA_KEY,
    authenticated_tenant,
    requested_tenant,
)

if TYPE_CHECKING:
    from stratad.server.resources import Resources
    from stratad.server.runner import Runner

__all__ = ["DEFAULT_TENANT", "TENANT_METADATA_KEY", "Servicer", "tenant_of"]


def tenant_of(context: grpc.aio.ServicerContext) -> str:
    """The tenant a call acts in: the one its credential settled (auth on, see
    server/auth.py), else the ``x-stratad-tenant`` metadata, else `default`."""
    settled = authenticated_tenant()
    if settled is not None:
        return settled
    return requested_tenant(context.invocation_metadata()) or DEFAULT_TENANT


def answer_admission(context: grpc.aio.ServicerContext) -> Callable[[int], None]:
    """What a handler calls with its answer's size before building a large
    answer: the native front door holds that much of its answer budget for the
    call, or refuses it RESOURCE_EXHAUSTED (FrontContext.reserve_answer).
    Without the front door (grpc.aio) nothing is held."""
    reserve: Callable[[int], None] | None = getattr(context, "reserve_answer", None)
    return reserve if reserve is not None else _admit_any


def _admit_any(size: int) -> None:
    del size


class Servicer:
    """What every servicer is: protobuf in, domain commands run by `calls`
    (server/runner.py, which alone decides where they run), protobuf out."""

    def __init__(self, resources: Resources) -> None:
        self.resources = resources
        self.engine = resources.engine
        #: Runs every domain command of a call: on the event loop or a worker thread.
        self.calls: Runner = resources.runner
