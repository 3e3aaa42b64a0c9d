"""JSON values <-> google.protobuf.Value (python/stratad/values.py): ints stay ints.

Also the checks every request's JSON passes (`check_json`): no NaN or
infinities, at most MAX_STRUCT_DEPTH levels of nesting, checked without recursion.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import struct_pb2

from stratad.errors import InvalidArgumentError
from stratad.server.servicers.convert import struct_to_dict
from stratad.values import (
    MAX_STRUCT_DEPTH,
    check_json,
    to_py,
    to_struct,
    to_value,
)


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        3,
        -7,
        2**53,
        0.5,
        -1e-9,
        "",
        "ünïcode ✓",
        [],
        {},
        [1, "a", None],
        {"rows": 3, "nested": {"list": [1.5, {"deep": True}]}},
    ],
)
def test_round_trip_keeps_json_values_and_int_types(value: Any) -> None:
    back = to_py(to_value(value))
    assert back == value
    assert type(back) is type(value)


def test_big_or_fractional_numbers_stay_floats() -> None:
    assert type(to_py(to_value(2.0**60))) is float
    assert type(to_py(to_value(2.5))) is float
    assert to_py(to_value(1.0)) == 1 and type(to_py(to_value(1.0))) is int


def test_missing_kind_and_non_finite_numbers_are_invalid() -> None:
    with pytest.raises(InvalidArgumentError, match="required"):
        to_py(struct_pb2.Value(), "result")
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(InvalidArgumentError, match="not a JSON number"):
            to_py(struct_pb2.Value(number_value=bad), "result")
    nested = to_struct({"a": 1})
    nested.fields["b"].number_value = float("nan")
    with pytest.raises(InvalidArgumentError):
        to_py(struct_pb2.Value(struct_value=nested))


def test_non_json_values_are_refused() -> None:
    with pytest.raises(TypeError):
        to_value({"when": object()})


def _nested(levels: int, lists: bool = False) -> struct_pb2.Value:
    """A Value nested `levels` objects (or lists) deep, built without the parser."""
    top = struct_pb2.Value()
    node = top
    for _ in range(levels):
        node = node.list_value.values.add() if lists else node.struct_value.fields["k"]
    node.number_value = 1
    return top


@pytest.mark.parametrize("lists", [False, True], ids=["objects", "lists"])
def test_nesting_up_to_the_limit_is_accepted_and_deeper_is_invalid(lists: bool) -> None:
    assert to_py(_nested(MAX_STRUCT_DEPTH, lists)) is not None
    with pytest.raises(InvalidArgumentError, match=f"deeper than {MAX_STRUCT_DEPTH}") as exc:
        to_py(_nested(MAX_STRUCT_DEPTH + 1, lists), "result")
    assert exc.value.reason == "INVALID_VALUE"
    assert "result" in exc.value.message


def test_depth_is_checked_without_recursion() -> None:
    # Far past Python's recursion limit: an InvalidArgumentError, not a RecursionError.
    deep = _nested(20_000)
    with pytest.raises(InvalidArgumentError, match="deeper"):
        check_json(deep, "value")
    with pytest.raises(InvalidArgumentError, match="deeper"):
        struct_to_dict(deep.struct_value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_checkpoint_metadata_refuses_non_finite_numbers(bad: float) -> None:
    metadata = to_struct({"ok": 1, "list": [1, {"x": 2}]})
    metadata.fields["list"].list_value.values[1].struct_value.fields["x"].number_value = bad
    with pytest.raises(InvalidArgumentError, match="not a JSON number") as exc:
        struct_to_dict(metadata)
    assert exc.value.reason == "INVALID_VALUE"
    assert "metadata" in exc.value.message


def test_checkpoint_metadata_converts_as_before() -> None:
    # struct_to_dict keeps MessageToDict's output (numbers stay floats).
    metadata = to_struct({"n": 3, "nested": {"l": [1, "a", None, True]}})
    assert struct_to_dict(metadata) == {"n": 3.0, "nested": {"l": [1.0, "a", None, True]}}
