"""The request messages of the SDK's calls, built once for `Client` and `AsyncClient`.

Owns what the two clients would otherwise each spell out: turning a method's
arguments into its protobuf request (metadata as a `Struct`, checked for depth
as the daemon checks it; retention, namespaces, prune strategies, pending
writes), and the decisions of a chunked save's retries (which refusals a new
upload plan can answer). The clients only make the calls; the framework
adapters (stratad.integrations) build their requests with the same functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypedDict

from google.protobuf import struct_pb2

from stratad.api.v1 import checkpoint_pb2, session_pb2
from stratad.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    StratadError,
)
from stratad.sdk.upload import Uploader, UploadPlan

#: Deepest nesting of objects and lists the daemon accepts in metadata (its
#: MAX_STRUCT_DEPTH, stratad/values.py): ``{"a": 1}`` is 1 level.
MAX_METADATA_DEPTH = 32


def check_depth(value: Any, what: str = "metadata") -> None:
    """Refuse ``value`` nested deeper than `MAX_METADATA_DEPTH` before it is sent,
    as the daemon would (InvalidArgumentError, reason INVALID_VALUE): deeper
    than about 33 levels protobuf itself fails to copy the Struct into a request
    with a DecodeError. An explicit stack: no depth exhausts Python's recursion."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Iterable[Any] = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        if depth + 1 > MAX_METADATA_DEPTH:
            raise InvalidArgumentError(
                f"{what} is nested deeper than {MAX_METADATA_DEPTH} levels of objects and lists",
                reason="INVALID_VALUE",
                metadata={"field": what, "max_depth": str(MAX_METADATA_DEPTH)},
            )
        stack.extend((child, depth + 1) for child in children)


def struct(value: dict[str, Any] | None) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    if value:
        check_depth(value)
        out.update(value)
    return out


# -- sessions ------------------------------------------------------------------------------


def create_session_request(
    session_id: str,
    labels: dict[str, str] | None,
    keep_last: int,
    max_age_seconds: float,
) -> session_pb2.CreateSessionRequest:
    return session_pb2.CreateSessionRequest(
        session_id=session_id,
        labels=labels or {},
        retention=session_pb2.RetentionPolicy(keep_last=keep_last, max_age_seconds=max_age_seconds),
    )


def copy_session_request(
    source_session_id: str,
    target_session_id: str,
    labels: dict[str, str] | None,
    checkpoint_ids: dict[str, str] | None,
) -> checkpoint_pb2.CopySessionRequest:
    return checkpoint_pb2.CopySessionRequest(
        source_session_id=source_session_id,
        target_session_id=target_session_id,
        labels=labels or {},
        checkpoint_ids=checkpoint_ids or {},
    )


def replace_structured_state_request(
    session_id: str, structured_json: bytes, expected_version: int
) -> session_pb2.ReplaceStructuredStateRequest:
    return session_pb2.ReplaceStructuredStateRequest(
        session_id=session_id, structured_json=structured_json, expected_version=expected_version
    )


# -- states and checkpoints ----------------------------------------------------------------


class SaveOptions(TypedDict, total=False):
    """The options of a save, as `Client.save_state` and `Client.pause_execution`
    (and their `AsyncClient` twins) take them as keywords: every field of
    SaveStateRequest but the session, the state and ``expected_version`` (a
    parameter of its own; ``chunked`` is the client's upload of the state).
    tests/unit/test_sdk_surface.py fails when the proto gains a field no
    parameter sets."""

    #: What the state is (e.g. ``application/json``), opaque to stratad.
    content_type: str
    #: A JSON object kept with the checkpoint (list_checkpoints filters on it).
    metadata: dict[str, Any] | None
    #: The checkpoint's ID (unique within the tenant); generated when empty.
    checkpoint_id: str
    #: Its parent; empty: the latest checkpoint of the namespace.
    parent_checkpoint_id: str
    namespace: str
    #: Start a new line: no parent even when the namespace has checkpoints
    #: (parent_checkpoint_id must then be empty).
    no_parent: bool


def save_request(
    session_id: str,
    data: bytes,
    *,
    content_type: str = "",
    metadata: dict[str, Any] | None = None,
    expected_version: int = 0,
    checkpoint_id: str = "",
    parent_checkpoint_id: str = "",
    namespace: str = "",
    no_parent: bool = False,
) -> checkpoint_pb2.SaveStateRequest:
    return checkpoint_pb2.SaveStateRequest(
        session_id=session_id,
        data=data,
        content_type=content_type,
        metadata=struct(metadata),
        expected_version=expected_version,
        checkpoint_id=checkpoint_id,
        parent_checkpoint_id=parent_checkpoint_id,
        namespace=namespace,
        no_parent=no_parent,
    )


def save_states_request(
    request: checkpoint_pb2.SaveStateRequest,
) -> checkpoint_pb2.SaveStatesRequest:
    """One save of a `save_states` stream."""
    return checkpoint_pb2.SaveStatesRequest(request=request)


def load_state_request(
    session_id: str,
    checkpoint_id: str,
    namespace: str,
    *,
    include_writes: bool = False,
    include_structured: bool = False,
) -> checkpoint_pb2.LoadStateRequest:
    return checkpoint_pb2.LoadStateRequest(
        session_id=session_id,
        checkpoint_id=checkpoint_id,
        namespace=namespace,
        include_writes=include_writes,
        include_structured=include_structured,
    )


def create_checkpoint_request(
    session_id: str,
    name: str,
    metadata: dict[str, Any] | None,
    checkpoint_id: str,
    expected_version: int,
) -> checkpoint_pb2.CreateCheckpointRequest:
    return checkpoint_pb2.CreateCheckpointRequest(
        session_id=session_id,
        name=name,
        metadata=struct(metadata),
        checkpoint_id=checkpoint_id,
        expected_version=expected_version,
    )


def list_checkpoints_request(
    session_id: str,
    namespace: str | None,
    metadata_filter: dict[str, Any] | None,
    before: str,
    page_size: int,
    page_token: str,
    include_writes: bool = False,
) -> checkpoint_pb2.ListCheckpointsRequest:
    """One page of `list_checkpoints` (``namespace`` None: every namespace)."""
    request = checkpoint_pb2.ListCheckpointsRequest(
        session_id=session_id,
        page_size=page_size,
        page_token=page_token,
        metadata_filter=struct(metadata_filter),
        before=before,
        include_writes=include_writes,
    )
    if namespace is not None:
        request.namespace = namespace
    return request


# -- pending writes, prune, delete by metadata ---------------------------------------------

_PRUNE_STRATEGIES = {
    "keep_latest": checkpoint_pb2.PRUNE_STRATEGY_KEEP_LATEST,
    "delete": checkpoint_pb2.PRUNE_STRATEGY_DELETE,
}


def prune_strategy(name: str) -> checkpoint_pb2.PruneStrategy.ValueType:
    try:
        return _PRUNE_STRATEGIES[name]
    except KeyError:
        raise ValueError(f"strategy must be one of {sorted(_PRUNE_STRATEGIES)}") from None


def prune_checkpoints_request(
    session_ids: Iterable[str], strategy: str
) -> checkpoint_pb2.PruneCheckpointsRequest:
    return checkpoint_pb2.PruneCheckpointsRequest(
        session_ids=list(session_ids), strategy=prune_strategy(strategy)
    )


def put_writes_request(
    session_id: str,
    checkpoint_id: str,
    task_id: str,
    writes: Iterable[tuple[int, str, str, bytes]],
    task_path: str = "",
    expected_version: int = 0,
) -> checkpoint_pb2.PutWritesRequest:
    return checkpoint_pb2.PutWritesRequest(
        session_id=session_id,
        checkpoint_id=checkpoint_id,
        task_id=task_id,
        task_path=task_path,
        expected_version=expected_version,
        writes=[
            checkpoint_pb2.WriteValue(idx=idx, channel=channel, type=type_, value=value)
            for idx, channel, type_, value in writes
        ],
    )


def delete_checkpoints_request(
    metadata_filters: Iterable[dict[str, Any]], session_id: str = "", namespace: str | None = None
) -> checkpoint_pb2.DeleteCheckpointsRequest:
    request = checkpoint_pb2.DeleteCheckpointsRequest(
        session_id=session_id, metadata_filters=[struct(f) for f in metadata_filters]
    )
    if namespace is not None:
        request.namespace = namespace
    return request


# -- chunked saves ---------------------------------------------------------------------------
#
# A save is sent as an upload plan (sdk/upload.py) when the client uploads in
# chunks. The daemon may refuse a plan that rests on what it no longer has; the
# clients retry (at most three plans) as these decide, then send the state whole.


def whole_request(
    request: checkpoint_pb2.SaveStateRequest, data: bytes | None
) -> checkpoint_pb2.SaveStateRequest:
    """`request` carrying its state whole (`data`, when it was kept apart; the
    caller's request is left as it was)."""
    if data is None:
        return request
    whole = checkpoint_pb2.SaveStateRequest()
    whole.CopyFrom(request)
    whole.data = data
    return whole


def missing_chunks(exc: StratadError) -> bool:
    """The daemon lacks chunks the plan assumed it has: the client asks which
    (FindMissingChunks) and sends them framed (`Uploader.with_frames`)."""
    return isinstance(exc, FailedPreconditionError) and "chunks are missing" in exc.message


def _deltas_refused(exc: StratadError) -> bool:
    """A daemon from before delta uploads cannot decode one (it has no base for
    it) and refuses the save; newer ones decode them against the stored base."""
    return isinstance(exc, InvalidArgumentError) and "cannot be decoded without its base" in (
        exc.message
    )


def _base_gone(exc: StratadError, plan: UploadPlan) -> bool:
    base = plan.request.chunked.base_checkpoint_id
    return isinstance(exc, NotFoundError) and bool(base) and base in exc.message


def replan(uploader: Uploader, plan: UploadPlan, exc: StratadError) -> UploadPlan | None:
    """The plan to send after the daemon refused `plan` with `exc` (other than
    `missing_chunks`): without its base checkpoint when that is gone, without
    deltas when the daemon cannot decode them; None when no plan helps (the
    client raises `exc`)."""
    if _base_gone(exc, plan):
        return uploader.without_base(plan)
    if _deltas_refused(exc) and uploader.deltas:
        return uploader.without_deltas(plan)
    return None
