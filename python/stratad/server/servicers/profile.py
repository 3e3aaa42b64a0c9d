"""ProfileService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

import grpc

from stratad.api.v1 import profile_pb2, profile_pb2_grpc
from stratad.domain.profiles import Insights, Profile, Profiles
from stratad.server.runner import CHEAP, IO
from stratad.server.servicers.base import Servicer, tenant_of
from stratad.server.servicers.convert import timestamp
from stratad.values import set_value, to_py


def profile_to_pb(p: Profile) -> profile_pb2.UserProfile:
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


def insights_of(request: profile_pb2.UpdateProfileRequest) -> Insights:
    """Cogency's interaction_insights dict: only the keys the request sets."""
    insights: Insights = {}
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

    async def GetProfile(
        self, request: profile_pb2.GetProfileRequest, context: grpc.aio.ServicerContext
    ) -> profile_pb2.GetProfileResponse:
        tenant = tenant_of(context)
        profile = await self.calls.run(
            CHEAP,
            self.domain.get,
            tenant,
            request.user_id,
            waits_on=self.calls.profile_lock(tenant),
        )
        return profile_pb2.GetProfileResponse(profile=profile_to_pb(profile))

    async def UpdateProfile(
        self, request: profile_pb2.UpdateProfileRequest, context: grpc.aio.ServicerContext
    ) -> profile_pb2.UpdateProfileResponse:
        profile, created = await self.calls.run(
            IO,
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
        tenant = tenant_of(context)
        text, truncated = await self.calls.run(
            CHEAP,
            self.domain.compress,
            tenant,
            request.user_id,
            request.max_tokens,
            waits_on=self.calls.profile_lock(tenant),
        )
        return profile_pb2.CompressProfileResponse(context=text, truncated=truncated)

    async def DeleteProfile(
        self, request: profile_pb2.DeleteProfileRequest, context: grpc.aio.ServicerContext
    ) -> profile_pb2.DeleteProfileResponse:
        await self.calls.run(IO, self.domain.delete, tenant_of(context), request.user_id)
        return profile_pb2.DeleteProfileResponse()
