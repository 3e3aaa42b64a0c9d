"""The inspector's pure parts: the JSON diff, state decoding, request parsing, its config."""

from __future__ import annotations

import pytest

from stratad.cli import build_parser
from stratad.config import Config, ConfigError, load_config
from stratad.server.inspector.http import BadRequest, parse_request
from stratad.server.inspector.jsondiff import diff, pointer
from stratad.server.inspector.reader import describe_state

# -- jsondiff --------------------------------------------------------------------------------


def ops(a: object, b: object) -> list[tuple[str, str]]:
    changes, truncated = diff(a, b)
    assert not truncated
    return [(c.op, pointer(c.path)) for c in changes]


def test_equal_values_have_no_change() -> None:
    value = {"a": [1, {"b": None}], "c": "x"}
    assert ops(value, {"c": "x", "a": [1, {"b": None}]}) == []


def test_object_members_added_removed_and_changed_at_depth() -> None:
    a = {"keep": 1, "gone": True, "deep": {"x": {"y": 1}}}
    b = {"keep": 1, "new": [1], "deep": {"x": {"y": 2}}}
    assert ops(a, b) == [("removed", "/gone"), ("added", "/new"), ("changed", "/deep/x/y")]


def test_arrays_compare_by_index_and_report_length_changes() -> None:
    assert ops([1, 2, 3], [1, 5]) == [("removed", "/2"), ("changed", "/1")]
    assert ops([], ["a", "b"]) == [("added", "/0"), ("added", "/1")]


@pytest.mark.parametrize(
    ("a", "b"), [(1, 1.0), (1, True), (0, False), ("1", 1), ({}, []), (None, 0)]
)
def test_a_change_of_json_type_is_a_change(a: object, b: object) -> None:
    assert ops({"v": a}, {"v": b}) == [("changed", "/v")]


def test_the_whole_document_replaced_has_the_empty_pointer() -> None:
    assert ops({"a": 1}, "text") == [("changed", "")]


def test_pointer_escapes_tilde_and_slash() -> None:
    assert ops({"a/b": 1, "m~n": 1}, {"a/b": 2, "m~n": 2}) == [
        ("changed", "/a~1b"),
        ("changed", "/m~0n"),
    ]


def test_deep_nesting_does_not_exhaust_the_stack() -> None:
    a: object = 0
    b: object = 1
    for _ in range(20_000):
        a, b = {"n": a}, {"n": b}
    changes, _ = diff(a, b)
    assert len(changes) == 1 and len(changes[0].path) == 20_000


def test_the_diff_stops_at_its_limit() -> None:
    changes, truncated = diff({}, {str(i): i for i in range(50)}, limit=10)
    assert len(changes) == 10 and truncated


def test_long_values_are_cut_in_the_preview() -> None:
    changes, _ = diff({}, {"big": "x" * 10_000})
    after = changes[0].to_json()["after"]
    assert len(after) < 2100 and after.endswith("…")


# -- how a state is shown ---------------------------------------------------------------------


def test_states_are_shown_as_json_text_binary_or_not_at_all() -> None:
    assert describe_state(b'{"a": [1]}', 10) == {
        "encoding": "json",
        "size": 10,
        "value": {"a": [1]},
    }
    text = describe_state(b"plain words", 11)
    assert text["encoding"] == "text" and text["text"] == "plain words"
    binary = describe_state(b"\xff\x00", 2)
    assert binary == {"encoding": "binary", "size": 2, "hex": "ff00"}
    assert describe_state(None, 1 << 30)["encoding"] == "too_large"


def test_nan_and_infinity_are_not_json() -> None:
    # Python's json accepts them; a browser's JSON.parse does not.
    assert describe_state(b'{"a": NaN}', 10)["encoding"] == "text"
    assert describe_state(b"[Infinity]", 10)["encoding"] == "text"


def test_json_nested_too_deep_for_the_parser_is_shown_as_text() -> None:
    deep = b"[" * 200_000 + b"]" * 200_000
    assert describe_state(deep, len(deep))["encoding"] == "text"


# -- request parsing ----------------------------------------------------------------------------


def head(text: str) -> bytes:
    return text.replace("\n", "\r\n").encode("latin-1")


def test_a_request_is_split_into_decoded_segments_and_query() -> None:
    request = parse_request(
        head("GET /api/tenants/a%2Fb/sessions/?q=x%20y&q=second HTTP/1.1\nHost: h\n\n")
    )
    assert request.segments == ("api", "tenants", "a/b", "sessions")
    assert request.query == {"q": "x y"}
    assert request.headers == {"host": "h"}


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("POST / HTTP/1.1\n\n", 405),
        ("GET / SPDY/3\n\n", 400),
        ("GET http://elsewhere/ HTTP/1.1\n\n", 400),
        ("GET /a b HTTP/1.1\n\n", 400),
        ("GET / HTTP/1.1\nno-colon-here\n\n", 400),
        ("GET / HTTP/1.1\n folded: header\n\n", 400),
        ("GET /%ff HTTP/1.1\n\n", 400),
        ("GET /?" + "&".join(f"k{i}=v" for i in range(40)) + " HTTP/1.1\n\n", 400),
        ("GET / HTTP/1.1\n" + "".join(f"h{i}: v\n" for i in range(100)) + "\n", 431),
    ],
)
def test_malformed_requests_are_refused(text: str, status: int) -> None:
    with pytest.raises(BadRequest) as excinfo:
        parse_request(head(text))
    assert excinfo.value.status == status


# -- configuration ---------------------------------------------------------------------------------


def test_the_inspector_is_off_by_default() -> None:
    assert Config().inspector_listen == ""
    assert load_config({}, {"STRATAD_INSPECTOR_LISTEN": "off"}).inspector_listen == ""


def test_inspector_listen_from_env_and_flags() -> None:
    assert load_config({}, {"STRATAD_INSPECTOR_LISTEN": "127.0.0.1:8080"}).inspector_listen == (
        "127.0.0.1:8080"
    )
    args = build_parser().parse_args(["serve", "--inspector", "[::1]:8081"])
    assert args.inspector_listen == "[::1]:8081"
    long_flag = build_parser().parse_args(["serve", "--inspector-listen", "localhost:0"])
    assert long_flag.inspector_listen == "localhost:0"


@pytest.mark.parametrize("value", ["unix:/run/inspector.sock", "8080", "host:port", "[::1:80"])
def test_a_bad_inspector_address_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match="inspector_listen"):
        Config(inspector_listen=value)


def test_a_non_loopback_inspector_needs_allow_insecure() -> None:
    with pytest.raises(ConfigError, match="allow_insecure"):
        Config(inspector_listen="0.0.0.0:8080")
    with pytest.raises(ConfigError, match="allow_insecure"):
        Config(inspector_listen="inspector.internal:8080")
    assert Config(inspector_listen="0.0.0.0:8080", allow_insecure=True).inspector_exposed
    assert not Config(inspector_listen="127.0.0.1:8080").inspector_exposed
