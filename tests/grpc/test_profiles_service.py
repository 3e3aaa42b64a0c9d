"""ProfileService over gRPC: the bounded merge, compress, tenancy, bad input, persistence."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import struct_pb2

from stratad.api.v1 import profile_pb2 as pb
from stratad.api.v1 import profile_pb2_grpc

if TYPE_CHECKING:
    from conftest import Api

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND


class Profiles:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.stub = profile_pb2_grpc.ProfileServiceStub(api.channel)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.stub, name)
        return lambda request: self.api.call(method, request)

    def method(self, name: str) -> Any:
        return getattr(self.stub, name)


@pytest.fixture
def profiles(api: Api) -> Profiles:
    return Profiles(api)


def pref(key: str, v: Any) -> pb.Preference:
    out = pb.Preference(key=key)
    out.value.CopyFrom(struct_pb2.Value(string_value=v) if isinstance(v, str) else
                       struct_pb2.Value(number_value=v))  # fmt: skip
    return out


def test_update_get_compress_delete(profiles: Profiles) -> None:
    first = profiles.UpdateProfile(
        pb.UpdateProfileRequest(
            user_id="alice",
            goals=["ship v2"],
            expertise=["python", "grpc"],
            communication_style="concise",
            preferences=[pref("language", "python"), pref("verbosity", 2)],
            project_context=[pb.Project(name="stratad", description="state sidecar")],
            success_pattern="small diffs",
        )
    )
    assert first.created
    p = first.profile
    assert (p.user_id, list(p.goals), list(p.expertise_areas)) == (
        "alice", ["ship v2"], ["python", "grpc"],
    )  # fmt: skip
    assert [(x.key, x.value.WhichOneof("kind")) for x in p.preferences] == [
        ("language", "string_value"), ("verbosity", "number_value"),
    ]  # fmt: skip
    assert (p.interaction_count, p.synthesis_version) == (1, 1)
    second = profiles.UpdateProfile(
        pb.UpdateProfileRequest(
            user_id="alice", goals=[f"g{n}" for n in range(12)], synthesized=True
        )
    )
    assert not second.created
    assert list(second.profile.goals) == [f"g{n}" for n in range(2, 12)]
    assert (second.profile.interaction_count, second.profile.synthesis_version) == (2, 2)
    assert second.profile.communication_style == "concise"  # unset fields change nothing
    assert profiles.GetProfile(pb.GetProfileRequest(user_id="alice")).profile == second.profile
    compressed = profiles.CompressProfile(pb.CompressProfileRequest(user_id="alice"))
    assert compressed.context == (
        "COMMUNICATION: concise\nCURRENT GOALS: g9; g10; g11\n"
        "PREFERENCES: language: python, verbosity: 2\n"
        "ACTIVE PROJECTS: stratad: state sidecar\nEXPERTISE: python, grpc"
    )
    assert not compressed.truncated
    cut = profiles.CompressProfile(pb.CompressProfileRequest(user_id="alice", max_tokens=5))
    assert (cut.context, cut.truncated) == ("COMMU", True)
    profiles.DeleteProfile(pb.DeleteProfileRequest(user_id="alice"))
    with pytest.raises(grpc.RpcError) as info:
        profiles.GetProfile(pb.GetProfileRequest(user_id="alice"))
    assert info.value.code() == NOT_FOUND  # type: ignore[attr-defined]


def test_profiles_are_per_tenant(api: Api, profiles: Profiles) -> None:
    profiles.UpdateProfile(pb.UpdateProfileRequest(user_id="alice", goals=["mine"]))
    other = api.as_tenant("other")
    for name, request in (
        ("GetProfile", pb.GetProfileRequest(user_id="alice")),
        ("CompressProfile", pb.CompressProfileRequest(user_id="alice")),
        ("DeleteProfile", pb.DeleteProfileRequest(user_id="alice")),
    ):
        other.fails(profiles.method(name), request, NOT_FOUND, "alice")
    theirs = other.call(
        profiles.method("UpdateProfile"), pb.UpdateProfileRequest(user_id="alice", goals=["theirs"])
    )
    assert theirs.created and list(theirs.profile.goals) == ["theirs"]
    mine = profiles.GetProfile(pb.GetProfileRequest(user_id="alice")).profile
    assert list(mine.goals) == ["mine"]


BAD: list[tuple[str, Any, grpc.StatusCode, str]] = [
    ("GetProfile", pb.GetProfileRequest(user_id=""), INVALID, "user_id"),
    ("GetProfile", pb.GetProfileRequest(user_id="nobody"), NOT_FOUND, "nobody"),
    ("UpdateProfile", pb.UpdateProfileRequest(user_id="../x"), INVALID, "user_id"),
    ("UpdateProfile", pb.UpdateProfileRequest(user_id="u", goals=["x" * 5000]), INVALID, "longer"),
    (
        "UpdateProfile",
        pb.UpdateProfileRequest(user_id="u", preferences=[pb.Preference(key="k")]),
        INVALID,
        "required",
    ),
    (
        "UpdateProfile",
        pb.UpdateProfileRequest(user_id="u", preferences=[pref("", "v")]),
        INVALID,
        "preference key",
    ),
    ("CompressProfile", pb.CompressProfileRequest(user_id="nobody"), NOT_FOUND, "nobody"),
    (
        "CompressProfile",
        pb.CompressProfileRequest(user_id="alice", max_tokens=-1),
        INVALID,
        "max_tokens",
    ),
    ("DeleteProfile", pb.DeleteProfileRequest(user_id="nobody"), NOT_FOUND, "nobody"),
    ("DeleteProfile", pb.DeleteProfileRequest(user_id="a b"), INVALID, "user_id"),
]


@pytest.mark.parametrize(("name", "request_", "code", "words"), BAD)
def test_bad_input(
    api: Api, profiles: Profiles, name: str, request_: Any, code: grpc.StatusCode, words: str
) -> None:
    profiles.UpdateProfile(pb.UpdateProfileRequest(user_id="alice", goals=["g"]))
    api.fails(profiles.method(name), request_, code, words)
    assert list(profiles.GetProfile(pb.GetProfileRequest(user_id="alice")).profile.goals) == ["g"]


def test_profiles_survive_a_restart(start_api: Callable[..., Api], tmp_path: Any) -> None:
    data_dir = tmp_path / "profile-data"
    api = start_api(data_dir=data_dir)
    Profiles(api).UpdateProfile(pb.UpdateProfileRequest(user_id="bob", interests=["chess"]))
    api.server.stop()
    again = start_api(data_dir=data_dir)
    profile = Profiles(again).GetProfile(pb.GetProfileRequest(user_id="bob")).profile
    assert list(profile.interests) == ["chess"]
