"""ProfileService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from stratad.api.v1 import profile_pb2, profile_pb2_grpc
from stratad.domain.profiles import Profiles
from stratad.server.servicers.base import Servicer, tenant_of
from stratad.server.servicers.convert import timestamp
from stratad.values import set_value, to_py

T = TypeVar("T")


def profile_to_pb(p: dict[str, Any]) -> profile_pb2.UserProfile:
    preferences = []
    for k, v in p["preferences"].items():
        pref = profile_pb2.Preference(key=k)
        set_value(pref.value, v)
        preferences.append(pref)
    return profile_pb2.UserProfile(
        user_id=p["user_id"],
        preferences=preferences,
        goals=p["goals"],
        expertise_areas=p["expertise_areas"],
        communication_style=p["communication_style"],
        projects=[profile_pb2.Project(name=k, description=v) for k, v in p["projects"].items()],
        interests=p["interests"],
        constraints=p["constraints"],
        success_patterns=p["success_patterns"],
        failure_patterns=p["failure_patterns"],
        created_at=timestamp(p["created_at"]),
        last_updated=timestamp(p["last_updated"]),
        interaction_count=p["interaction_count"],
        synthesis_version=p["synthesis_version"],
    )


def insights_of(request: profile_pb2.UpdateProfileRequest) -> dict[str, Any]:
    """Cogency's interaction_insights dict: only the keys the request sets."""
    insights: dict[str, Any] = {}
    if request.preferences:
        insights["preferences"] = {
            p.key: to_py(p.value, f"preference {p.key!r}") for p in request.preferences
        }
    for name in ("goals", "expertise", "interests", "constraints"):
        values = list(getattr(request, name))
        if values:
            insights[name] = values
    if request.HasField("communication_style"):
        insights["communication_style"] = request.communication_style
    if request.HasField("success_pattern"):
        insights["success_pattern"] = request.success_pattern
    if request.HasField("failure_pattern"):
        insights["failure_pattern"] = request.failure_pattern
    if request.project_context:
        insights["project_context"] = {p.name: p.description for p in request.project_context}
    return insights


class ProfileServicer(Servicer, profile_pb2_grpc.ProfileServiceServicer):
    @property
    def domain(self) -> Profiles:
        return self.engine.profiles

    async def _read(self, fn: Callable[..., T], tenant: str, *args: Any) -> T:
        """A cheap read: on the event loop, unless the tenant's profile lock is
        held across a compaction's fsyncs (see Servicer.read)."""
        if self.domain.held_for_io(tenant):
            return await self.run(fn, tenant, *args)
        return fn(tenant, *args)

    async def GetProfile(
        self, request: profile_pb2.GetProfileRequest, context: grpc.aio.ServicerContext
    ) -> profile_pb2.GetProfileResponse:
        profile = await self._read(self.domain.get, tenant_of(context), request.user_id)
        return profile_pb2.GetProfileResponse(profile=profile_to_pb(profile))

    async def UpdateProfile(
        self, request: profile_pb2.UpdateProfileRequest, context: grpc.aio.ServicerContext
    ) -> profile_pb2.UpdateProfileResponse:
        profile, created = await self.run(
            self.domain.update,
            tenant_of(context),
            request.user_id,
            insights_of(request),
            synthesized=request.synthesized,
        )
        return profile_pb2.UpdateProfileResponse(profile=profile_to_pb(profile), created=created)

    async def CompressProfile(
        self, request: profile_pb2.CompressProfileRequest, context: grpc.aio.ServicerContext
    ) -> profile_pb2.CompressProfileResponse:
        text, truncated = await self._read(
            self.domain.compress, tenant_of(context), request.user_id, request.max_tokens
        )
        return profile_pb2.CompressProfileResponse(context=text, truncated=truncated)

    async def DeleteProfile(
        self, request: profile_pb2.DeleteProfileRequest, context: grpc.aio.ServicerContext
    ) -> profile_pb2.DeleteProfileResponse:
        await self.run(self.domain.delete, tenant_of(context), request.user_id)
        return profile_pb2.DeleteProfileResponse()
