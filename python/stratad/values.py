"""JSON values <-> google.protobuf.Value / Struct, for every layer that speaks the API.

JSON has one number type and google.protobuf.Value carries doubles, so an
integral number within 2**53 comes back as a Python int (a task result
``{"n": 3}`` stays ``{"n": 3}``, not ``3.0``). A Value with no kind set is
"missing", not null; NaN and infinities are not JSON and are refused, and so
is nesting deeper than `MAX_STRUCT_DEPTH` (`check_json`, which `struct_to_dict`
of convert.py applies to checkpoint metadata too).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from google.protobuf import struct_pb2

from stratad.errors import InvalidArgumentError

_EXACT = 2**53

#: Deepest nesting of objects (Structs) and lists accepted in a JSON value from
#: a request: ``{"a": 1}`` is 1 level, ``{"a": [1]}`` 2. Deeper values are
#: INVALID_ARGUMENT. (The protobuf parser stops at 100 nested messages, about
#: 33 levels of Structs, before a request gets here.)
MAX_STRUCT_DEPTH = 32

JsonMessage = struct_pb2.Struct | struct_pb2.Value | struct_pb2.ListValue


def check_json(value: JsonMessage, what: str = "value") -> None:
    """Refuse numbers that are not finite and nesting deeper than `MAX_STRUCT_DEPTH`.

    Walks `value` with an explicit stack, so no input can exhaust Python's
    recursion limit; raises `InvalidArgumentError` (reason INVALID_VALUE).
    """
    stack: list[tuple[JsonMessage, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, struct_pb2.Value):
            kind = node.WhichOneof("kind")
            if kind == "struct_value":
                stack.append((node.struct_value, depth))
            elif kind == "list_value":
                stack.append((node.list_value, depth))
            elif kind == "number_value" and not math.isfinite(node.number_value):
                raise _not_a_number(what, node.number_value)
            continue
        depth += 1
        if depth > MAX_STRUCT_DEPTH:
            raise InvalidArgumentError(
                f"{what} is nested deeper than {MAX_STRUCT_DEPTH} levels of objects and lists",
                reason="INVALID_VALUE",
                metadata={"field": what, "max_depth": str(MAX_STRUCT_DEPTH)},
            )
        items = node.fields.values() if isinstance(node, struct_pb2.Struct) else node.values
        stack.extend((item, depth) for item in items)


def _not_a_number(what: str, n: float) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{what} holds {n}, which is not a JSON number (NaN and infinities are refused)",
        reason="INVALID_VALUE",
        metadata={"field": what},
    )


def to_py(value: struct_pb2.Value, what: str = "value") -> Any:
    check_json(value, what)
    return _to_py(value, what)


def _to_py(value: struct_pb2.Value, what: str) -> Any:
    # Recursion is bounded: check_json refused anything deeper than MAX_STRUCT_DEPTH.
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return {k: _to_py(v, what) for k, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_to_py(v, what) for v in value.list_value.values]
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        n = value.number_value
        if not math.isfinite(n):
            raise _not_a_number(what, n)
        return int(n) if n.is_integer() and abs(n) <= _EXACT else n
    if kind == "bool_value":
        return value.bool_value
    if kind == "null_value":
        return None
    raise InvalidArgumentError(f"{what} is required (a google.protobuf.Value with a kind set)")


def struct_to_py(value: struct_pb2.Struct, what: str = "value") -> dict[str, Any]:
    check_json(value, what)
    return {k: _to_py(v, what) for k, v in value.fields.items()}


def structs_to_py(values: Iterable[struct_pb2.Struct], what: str) -> list[dict[str, Any]]:
    return [struct_to_py(v, what) for v in values]


def set_value(out: struct_pb2.Value, value: Any) -> struct_pb2.Value:
    """Fill `out` with the JSON value `value`; return it."""
    if value is None:
        out.null_value = struct_pb2.NULL_VALUE
    elif isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, (int, float)):
        out.number_value = value
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, dict):
        fill_struct(out.struct_value, value)
    elif isinstance(value, (list, tuple)):
        items = out.list_value
        items.SetInParent()
        for item in value:
            set_value(items.values.add(), item)
    else:  # the domain only stores JSON values
        raise TypeError(f"not a JSON value: {type(value).__name__}")
    return out


def to_value(value: Any) -> struct_pb2.Value:
    return set_value(struct_pb2.Value(), value)


def fill_struct(out: struct_pb2.Struct, value: dict[str, Any]) -> struct_pb2.Struct:
    out.SetInParent()
    for k, v in value.items():
        set_value(out.fields[k], v)
    return out


def to_struct(value: dict[str, Any]) -> struct_pb2.Struct:
    return fill_struct(struct_pb2.Struct(), value)
