"""The daemon's answers as the JSON a model reads (cognitive state, crystals,
checkpoints, states by content type), and the checks of what is sent to it
(state size, JSON values the daemon would refuse). The tools and the
resources (`stratad.mcp.resources`) show the same things the same way."""

from __future__ import annotations

import base64
import json
import math
from datetime import UTC, datetime
from typing import Any

from google.protobuf import struct_pb2, timestamp_pb2

from stratad.api.v1 import checkpoint_pb2, cognitive_pb2, crystal_pb2
from stratad.errors import InvalidArgumentError, ResourceExhaustedError
from stratad.mcp.tools.base import Limits
from stratad.sdk.client import check_depth
from stratad.values import set_value, struct_to_py


def when(ts: timestamp_pb2.Timestamp) -> str | None:
    if not ts.seconds and not ts.nanos:
        return None
    return datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, UTC).isoformat()


def crystallized_dict(c: cognitive_pb2.CrystallizedState) -> dict[str, Any]:
    return {
        "goal": c.goal,
        "constraints": list(c.constraints),
        "success_criteria": list(c.success_criteria),
        "user_identity": dict(c.user_identity),
        "project_context": c.project_context,
        "created_at": when(c.created_at),
    }


def fluid_dict(f: cognitive_pb2.FluidState) -> dict[str, Any]:
    return {
        "progress": f.progress,
        "current_sub_goal": f.current_sub_goal,
        "sub_goals": [{"goal": g.goal, "status": g.status} for g in f.sub_goals],
        "active_entities": dict(f.active_entities),
        "open_questions": list(f.open_questions),
        "step_count": f.step_count,
        "last_updated": when(f.last_updated),
    }


_ERROR_STATUS = {
    cognitive_pb2.ERROR_STATUS_OPEN: "open",
    cognitive_pb2.ERROR_STATUS_RESOLVED: "resolved",
}


def error_entry(e: cognitive_pb2.ErrorEntry) -> dict[str, Any]:
    return {
        "step": e.step,
        "error": e.error,
        "resolution": e.resolution,
        "pattern": e.pattern,
        "status": _ERROR_STATUS.get(e.status, "unknown"),
    }


def cognitive_state(state: cognitive_pb2.CognitiveState, version: int) -> dict[str, Any]:
    insights = state.insights
    return {
        "crystallized": crystallized_dict(state.crystallized),
        "fluid": fluid_dict(state.fluid),
        "insights": {
            "decision_log": [
                {
                    "step": d.step,
                    "decision": d.decision,
                    "rationale": d.rationale,
                    "timestamp": when(d.timestamp),
                }
                for d in insights.decision_log
            ],
            "error_journal": [error_entry(e) for e in insights.error_journal],
            "learned_constraints": list(insights.learned_constraints),
            "entity_relationships": [
                {"from": r.entity_a, "relation": r.relation, "to": r.entity_b}
                for r in insights.entity_relationships
            ],
            "pattern_observations": list(insights.pattern_observations),
        },
        "version": version,
    }


def crystal_dict(c: crystal_pb2.Crystal) -> dict[str, Any]:
    return {
        "crystal_id": c.crystal_id,
        "goal_template": c.goal_template,
        "decision_chain": list(c.decision_chain),
        "tool_sequence": list(c.tool_sequence),
        "error_patterns": [
            {"error": p.error, "resolution": p.resolution} for p in c.error_patterns
        ],
        "success_score": c.success_score,
        "effectiveness": c.effectiveness,
        "reuse_count": c.reuse_count,
        "entity_types": list(c.entity_types),
        "created_from": c.created_from,
        "created_at": when(c.created_at),
    }


def checkpoint_dict(cp: checkpoint_pb2.Checkpoint) -> dict[str, Any]:
    return {
        "checkpoint_id": cp.checkpoint_id,
        "name": cp.name,
        "version": cp.version,
        "created_at": when(cp.created_at),
        "content_type": cp.content_type,
        "size": cp.size,
        "namespace": cp.namespace,
        "parent_checkpoint_id": cp.parent_checkpoint_id,
        "metadata": struct_to_py(cp.metadata, "metadata"),
    }


def is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def decode_state(data: bytes, content_type: str) -> tuple[str, Any]:
    """How a state is shown: ("state", JSON value) for a JSON state, ("state_text", str)
    for text/*, else ("state_base64", str). An empty content type whose bytes parse
    as JSON counts as JSON."""
    media = content_type.split(";", 1)[0].strip().lower()
    if is_json_type(content_type) or not media:
        try:
            return "state", json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            pass
    if media.startswith("text/"):
        try:
            return "state_text", data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return "state_base64", base64.b64encode(data).decode("ascii")


def check_state_size(size: int, limits: Limits, what: str = "the state") -> None:
    if size > limits.max_state_bytes:
        raise ResourceExhaustedError(
            f"{what} is {size} bytes, over this MCP server's limit of {limits.max_state_bytes} "
            "bytes (--max-state-bytes); save and load larger states with the SDK or "
            "`stratad ctl state get`",
            reason="STATE_TOO_LARGE",
            metadata={"size": str(size), "limit": str(limits.max_state_bytes)},
        )


def json_value(value: Any, what: str) -> struct_pb2.Value:
    """A JSON value as a protobuf Value, refused (INVALID_VALUE) when the daemon would refuse it."""
    check_depth(value, what)
    _check_finite(value, what)
    return set_value(struct_pb2.Value(), value)


def _check_finite(value: Any, what: str) -> None:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            raise InvalidArgumentError(
                f"{what} holds {node}, which is not a JSON number",
                reason="INVALID_VALUE",
                metadata={"field": what},
            )
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


__all__ = [
    "check_state_size",
    "checkpoint_dict",
    "cognitive_state",
    "crystal_dict",
    "crystallized_dict",
    "decode_state",
    "error_entry",
    "fluid_dict",
    "is_json_type",
    "json_value",
    "when",
]
