"""Reading states for people: decode them, and compare two of them.

stratad stores opaque bytes; `ctl checkpoints show`, `checkpoints diff` and
`state get --decode` make sense of the usual ones:

- ``langgraph``: a checkpoint StratadSaver stored (content type
  ``application/vnd.langgraph.checkpoint+<serde type>``, the bytes of
  LangGraph's serializer, JsonPlusSerializer by default) decoded with
  LangGraph's own serializer in its strict mode (`strict_langgraph_serde`),
  then turned into JSON (`to_jsonable`). Strict because the default one
  imports and calls whatever callable the bytes name, and whoever saved a
  state is not whoever reads it (an operator, the inspector): decoding must
  never run code. Pickled checkpoints are refused for the same reason;
- ``json``: the bytes parsed as UTF-8 JSON;
- ``raw``: the bytes themselves.

`diff` compares two decoded values and names each difference by its JSON
Pointer (RFC 6901: ``/messages/3/content``; ``""`` is the whole document).
Objects are compared key by key, arrays index by index (an element inserted
at the front shows as every later index changed, and one added at the end).
`byte_diff` summarises two states that are not JSON: sizes, the common prefix
and suffix, and the content-defined chunks they share (how stratad dedups them).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import enum
import functools
import json
import uuid
from dataclasses import dataclass
from typing import Any

from stratad import native
from stratad.errors import FailedPreconditionError, InvalidArgumentError

#: Content types of the states StratadSaver stores (stratad.integrations.langgraph).
LANGGRAPH_CONTENT_TYPE_PREFIX = "application/vnd.langgraph.checkpoint+"


class DecodeError(InvalidArgumentError):
    """The state is not in the format asked for."""


@dataclass
class Decoded:
    #: "langgraph", "json" or "bytes"
    kind: str
    #: JSON-able for langgraph and json; the bytes for "bytes".
    value: Any


def decode(data: bytes, content_type: str, how: str = "auto") -> Decoded:
    """The state as ``how`` says (auto: LangGraph, else JSON, else bytes)."""
    if how == "raw":
        return Decoded("bytes", data)
    if how == "langgraph" or (how == "auto" and is_langgraph(content_type)):
        return Decoded("langgraph", decode_langgraph(data, content_type))
    try:
        return Decoded("json", json.loads(data))
    except (UnicodeDecodeError, ValueError) as exc:
        if how == "json":
            raise DecodeError(f"the state is not JSON: {exc}") from None
        return Decoded("bytes", data)


def is_langgraph(content_type: str) -> bool:
    return content_type.startswith(LANGGRAPH_CONTENT_TYPE_PREFIX)


def decode_langgraph(data: bytes, content_type: str) -> Any:
    """A StratadSaver checkpoint as JSON: ``{checkpoint, metadata, parent_checkpoint_id}``."""
    if not is_langgraph(content_type):
        raise DecodeError(
            f"not a checkpoint StratadSaver stored: its content type is {content_type!r}, "
            f"not {LANGGRAPH_CONTENT_TYPE_PREFIX}<type>"
        )
    serde_type = content_type[len(LANGGRAPH_CONTENT_TYPE_PREFIX) :]
    if serde_type == "pickle":
        raise DecodeError(
            "this checkpoint is pickled, and stratad never unpickles what agents stored "
            "(unpickling can run code): read it with --decode raw"
        )
    serde = strict_langgraph_serde()
    try:
        value = loads_langgraph_state(serde, serde_type, data)
    except Exception as exc:
        raise DecodeError(
            f"LangGraph's serializer cannot read this {serde_type!r} checkpoint: {exc}"
        ) from None
    return to_jsonable(value)


#: The first bytes of a StratadSaver checkpoint in its piece layout
#: (stratad.integrations.langgraph.LAYOUT_MAGIC); earlier ones are one payload.
LANGGRAPH_LAYOUT_MAGIC = b"SLG2\n"


def loads_langgraph_state(serde: Any, serde_type: str, data: bytes) -> Any:
    """``{checkpoint, metadata, parent_checkpoint_id}`` of a StratadSaver state, in
    either of the layouts it has written."""
    if data.startswith(LANGGRAPH_LAYOUT_MAGIC):
        from stratad.integrations.langgraph import decode_layout

        return decode_layout(serde, data)
    return serde.loads_typed((serde_type, data))


@functools.cache
def strict_langgraph_serde() -> Any:
    """LangGraph's JsonPlusSerializer, strict: only its allowlist of safe types (messages,
    Send, Interrupt, datetimes, ...) is rebuilt, never an arbitrary callable, never pickle."""
    try:
        from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    except ImportError:
        raise FailedPreconditionError(
            "decoding a LangGraph checkpoint needs langgraph: pip install 'stratad[langgraph]' "
            "(or langgraph) where stratad ctl runs"
        ) from None
    return JsonPlusSerializer(
        pickle_fallback=False, allowed_json_modules=None, allowed_msgpack_modules=None
    )


def to_jsonable(value: Any) -> Any:
    """Plain JSON values for what LangGraph checkpoints hold (messages, sets, bytes...)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        items = [to_jsonable(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, bytes | bytearray):
        return {"$bytes_base64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    dump = getattr(value, "model_dump", None)  # pydantic v2 (LangChain messages)
    if callable(dump):
        return {"$type": type(value).__name__, **to_jsonable(dump())}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"$type": type(value).__name__, **to_jsonable(fields)}
    as_dict = getattr(value, "_asdict", None)  # namedtuples (LangGraph's Send, ...)
    if callable(as_dict):
        return {"$type": type(value).__name__, **to_jsonable(as_dict())}
    return {"$type": type(value).__name__, "repr": repr(value)}


# --- comparing ------------------------------------------------------------------------


def diff(before: Any, after: Any) -> list[dict[str, Any]]:
    """Every difference from ``before`` to ``after``: ``{op, path, before?, after?}``."""
    changes: list[dict[str, Any]] = []
    _diff(before, after, "", changes)
    return changes


def _diff(a: Any, b: Any, path: str, out: list[dict[str, Any]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a:
            child = f"{path}/{pointer_token(key)}"
            if key in b:
                _diff(a[key], b[key], child, out)
            else:
                out.append({"op": "removed", "path": child, "before": a[key]})
        for key in b:
            if key not in a:
                out.append({"op": "added", "path": f"{path}/{pointer_token(key)}", "after": b[key]})
        return
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            child = f"{path}/{i}"
            if i >= len(b):
                out.append({"op": "removed", "path": child, "before": a[i]})
            elif i >= len(a):
                out.append({"op": "added", "path": child, "after": b[i]})
            else:
                _diff(a[i], b[i], child, out)
        return
    if type(a) is not type(b) or a != b:
        out.append({"op": "changed", "path": path, "before": a, "after": b})


def pointer_token(key: str) -> str:
    """A key as one JSON Pointer reference token (RFC 6901 escapes ``~`` and ``/``)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def byte_diff(a: bytes, b: bytes) -> dict[str, Any]:
    """How two opaque states differ: sizes, common prefix/suffix, shared chunks."""
    prefix = _common_prefix(a, b)
    suffix = _common_prefix(a[prefix:][::-1], b[prefix:][::-1])
    chunks_a, chunks_b = _chunks(a), _chunks(b)
    shared = chunks_a.keys() & chunks_b.keys()
    return {
        "identical": a == b,
        "size_a": len(a),
        "size_b": len(b),
        "common_prefix_bytes": prefix,
        "common_suffix_bytes": suffix,
        "first_difference_at": None if a == b else prefix,
        "chunks_a": len(chunks_a),
        "chunks_b": len(chunks_b),
        "chunks_shared": len(shared),
        "bytes_shared": sum(chunks_a[d] for d in shared),
    }


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low


def _chunks(data: bytes) -> dict[str, int]:
    """Distinct content-defined chunks of ``data`` (stratad's FastCDC): digest -> length."""
    found = {}
    for offset, length in native.chunk_boundaries(data) if data else []:
        found[native.digest_hex(data[offset : offset + length])] = length
    return found


__all__ = [
    "LANGGRAPH_CONTENT_TYPE_PREFIX",
    "DecodeError",
    "Decoded",
    "byte_diff",
    "decode",
    "decode_langgraph",
    "diff",
    "is_langgraph",
    "loads_langgraph_state",
    "pointer_token",
    "to_jsonable",
]
