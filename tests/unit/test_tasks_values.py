"""JSON values <-> google.protobuf.Value (server/servicers/values.py): ints stay ints."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import struct_pb2

from stratad.errors import InvalidArgumentError
from stratad.server.servicers.values import to_py, to_struct, to_value


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
