"""Protobuf <-> domain conversions shared by the servicers (nothing else)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from stratad.api.v1 import checkpoint_pb2, common_pb2, session_pb2
from stratad.domain.checkpoints import LoadResult, SaveResult
from stratad.domain.events import SessionEvent
from stratad.domain.models import Checkpoint, SessionStatus
from stratad.domain.sessions import SessionInfo
from stratad.values import check_json

_STATUS_TO_PB: dict[SessionStatus, common_pb2.SessionStatus.ValueType] = {
    SessionStatus.ACTIVE: common_pb2.SESSION_STATUS_ACTIVE,
    SessionStatus.PAUSED: common_pb2.SESSION_STATUS_PAUSED,
    SessionStatus.COMPLETED: common_pb2.SESSION_STATUS_COMPLETED,
    SessionStatus.FAILED: common_pb2.SESSION_STATUS_FAILED,
}


def timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def struct_to_dict(value: struct_pb2.Struct, what: str = "metadata") -> dict[str, Any]:
    """A request's Struct as a dict: INVALID_ARGUMENT for NaN, infinities or over-deep nesting."""
    if not value.fields:  # most requests send none: skip the walk and the conversion
        return {}
    check_json(value, what)  # MessageToDict raises ValueError on NaN and recurses
    return json_format.MessageToDict(value)


def dict_to_struct(value: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def status_to_pb(status: SessionStatus | str) -> common_pb2.SessionStatus.ValueType:
    if not status:
        return common_pb2.SessionStatus.SESSION_STATUS_UNSPECIFIED
    return _STATUS_TO_PB[SessionStatus(status)]


def session_to_pb(info: SessionInfo) -> session_pb2.Session:
    return session_pb2.Session(
        session_id=info.session_id,
        status=status_to_pb(info.status),
        version=info.version,
        labels=info.labels,
        created_at=timestamp(info.created_at),
        updated_at=timestamp(info.updated_at),
        checkpoint_count=info.checkpoint_count,
        head_checkpoint_id=info.head,
        retention=session_pb2.RetentionPolicy(
            keep_last=info.keep_last, max_age_seconds=info.max_age_seconds
        ),
        forked_from_checkpoint_id=info.forked_from,
    )


def event_to_pb(session_id: str, event: SessionEvent) -> session_pb2.SessionEvent:
    return session_pb2.SessionEvent(
        session_id=session_id,
        version=event.version,
        kind=event.kind,
        at=timestamp(event.at),
        checkpoint_id=event.checkpoint_id,
        status=status_to_pb(event.status),
    )


def checkpoint_to_pb(cp: Checkpoint) -> checkpoint_pb2.Checkpoint:
    return checkpoint_pb2.Checkpoint(
        checkpoint_id=cp.checkpoint_id,
        session_id=cp.session_id,
        version=cp.version,
        parent_checkpoint_id=cp.parent_id,
        namespace=cp.namespace,
        name=cp.name,
        content_type=cp.content_type,
        metadata=dict_to_struct(cp.metadata),
        created_at=timestamp(cp.created_at),
        size=cp.size,
        digest=cp.digest,
        stored_bytes=cp.stored_bytes,
    )


def save_to_pb(result: SaveResult) -> checkpoint_pb2.SaveStateResponse:
    cp = result.checkpoint
    return checkpoint_pb2.SaveStateResponse(
        checkpoint_id=cp.checkpoint_id,
        version=result.version,
        digest=cp.digest,
        size=cp.size,
        stored_bytes=result.stored_bytes,
    )


def load_to_pb(result: LoadResult) -> checkpoint_pb2.LoadStateResponse:
    cp = result.checkpoint
    return checkpoint_pb2.LoadStateResponse(
        data=result.data,
        content_type=cp.content_type,
        metadata=dict_to_struct(cp.metadata),
        checkpoint_id=cp.checkpoint_id,
        version=result.version,
        digest=cp.digest,
        checkpoint=checkpoint_to_pb(cp),
        structured_json=result.structured,
    )
