"""The ``checkpoint_*`` tools: save a state (JSON or base64 bytes, optionally named),
load one, list a session's checkpoints (CheckpointService); `list_checkpoints`
serves the checkpoint-list resource too."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from stratad.api.v1 import checkpoint_pb2
from stratad.errors import InvalidArgumentError
from stratad.mcp.daemon import DaemonLink, Identity
from stratad.mcp.tools.arguments import (
    ListCheckpointsArgs,
    LoadCheckpointArgs,
    SaveCheckpointArgs,
)
from stratad.mcp.tools.base import READS, WRITES, Call, Output, Toolbox
from stratad.mcp.tools.convert import check_state_size, checkpoint_dict, decode_state
from stratad.sdk.client import check_depth, struct
from stratad.values import struct_to_py

toolbox = Toolbox()
tool = toolbox.tool


@tool("checkpoint_save", "Save a checkpoint", SaveCheckpointArgs, WRITES)
async def checkpoint_save(call: Call, args: SaveCheckpointArgs) -> Output:
    """Save a snapshot of your working state (any JSON value, or base64 bytes) as a new
    checkpoint of the session, to resume from later with checkpoint_load. The checkpoint
    also captures the session's cognitive and task state. Give a name to keep it until it
    is deleted. Creates the session if it does not exist."""
    given = args.model_fields_set
    has_state = "state" in given
    has_blob = "state_base64" in given and args.state_base64 is not None
    if has_state == has_blob:
        raise InvalidArgumentError(
            "give exactly one of state (a JSON value) and state_base64 (base64 bytes)",
            reason="STATE_REQUIRED",
        )
    if has_blob:
        assert args.state_base64 is not None
        check_state_size(len(args.state_base64) * 3 // 4, call.limits)
        try:
            data = base64.b64decode(args.state_base64, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgumentError(
                "state_base64 is not valid base64", reason="INVALID_BASE64"
            ) from None
        content_type = args.content_type or "application/octet-stream"
    else:
        check_depth(args.state, "state")
        try:
            text = json.dumps(
                args.state, separators=(",", ":"), ensure_ascii=False, allow_nan=False
            )
        except ValueError:
            raise InvalidArgumentError(
                "state holds a number that is not JSON (NaN or infinity)", reason="INVALID_VALUE"
            ) from None
        data = text.encode("utf-8")
        content_type = args.content_type or "application/json"
    check_state_size(len(data), call.limits)
    await call.ensure_session(args.session_id)
    request = checkpoint_pb2.SaveStateRequest(
        session_id=args.session_id,
        data=data,
        content_type=content_type,
        metadata=struct(args.metadata),
        checkpoint_id=args.checkpoint_id,
    )
    response = await call.ask(call.link.checkpoints.SaveState, request)
    out: dict[str, Any] = {
        "checkpoint_id": response.checkpoint_id,
        "version": response.version,
        "digest": response.digest,
        "size": response.size,
        "stored_bytes": response.stored_bytes,
        "content_type": content_type,
    }
    if args.name:
        pin = checkpoint_pb2.CreateCheckpointRequest(
            session_id=args.session_id, name=args.name, metadata=struct(args.metadata)
        )
        named = await call.ask(call.link.checkpoints.CreateCheckpoint, pin)
        out["named_checkpoint_id"] = named.checkpoint.checkpoint_id
        out["name"] = named.checkpoint.name
        out["version"] = named.checkpoint.version
    return Output(out)


@tool("checkpoint_load", "Load a checkpoint", LoadCheckpointArgs, READS)
async def checkpoint_load(call: Call, args: LoadCheckpointArgs) -> Output:
    """Load a saved state: the latest one of the session, or the checkpoint you name. A JSON
    state comes back as JSON (state), a text state as text (state_text), anything else as
    base64 (state_base64), with its content_type. States over the server's size limit are
    refused with RESOURCE_EXHAUSTED STATE_TOO_LARGE."""
    request = checkpoint_pb2.LoadStateRequest(
        session_id=args.session_id, checkpoint_id=args.checkpoint_id
    )
    response = await call.ask(call.link.checkpoints.LoadState, request)
    check_state_size(len(response.data), call.limits)
    key, value = decode_state(response.data, response.content_type)
    out = {
        "checkpoint_id": response.checkpoint_id,
        "version": response.version,
        "content_type": response.content_type,
        "digest": response.digest,
        "size": len(response.data),
        "metadata": struct_to_py(response.metadata, "metadata"),
        key: value,
    }
    return Output(out)


@tool("checkpoint_list", "List checkpoints", ListCheckpointsArgs, READS)
async def checkpoint_list(call: Call, args: ListCheckpointsArgs) -> Output:
    """List the session's checkpoints, newest first: ID, name (named ones are pinned),
    creation time, size, content type and metadata. Load one with checkpoint_load."""
    listed = await list_checkpoints(call.link, call.who, args.session_id, args.limit)
    checkpoints, more = listed
    return Output({"checkpoints": checkpoints, "more": more})


async def list_checkpoints(
    link: DaemonLink, who: Identity, session_id: str, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``limit`` checkpoints, newest first, and whether there are more."""
    found: list[dict[str, Any]] = []
    token = ""
    while True:
        request = checkpoint_pb2.ListCheckpointsRequest(
            session_id=session_id, page_size=min(limit - len(found) + 1, 1000), page_token=token
        )
        page = await link.call(link.checkpoints.ListCheckpoints, request, who)
        for cp in page.checkpoints:
            if len(found) == limit:
                return found, True
            found.append(checkpoint_dict(cp))
        token = page.next_page_token
        if not token:
            return found, False
        if len(found) == limit:
            return found, True


__all__ = ["list_checkpoints", "toolbox"]
