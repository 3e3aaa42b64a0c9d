"""stratad.integrations.adk without a daemon: how ADK names become stratad IDs, and
the session document's format.

ADK's app names, user IDs and session IDs are any strings; stratad IDs are
``[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}``. The encoding must give a valid ID for
every name, different IDs for different names (two ADK sessions must never
share one stratad session), stay readable and reversible for ordinary names,
and keep ``.`` free for the separator so that listing one app's or one user's
sessions is a prefix.
"""

from __future__ import annotations

import json

import pytest
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types
from hypothesis import given, settings
from hypothesis import strategies as st

from stratad.ids import validate_id
from stratad.integrations.adk import (
    app_state_id,
    decode_document,
    decode_part,
    encode_document,
    encode_part,
    session_id_of,
    user_state_id,
)

names = st.text(max_size=80)


@given(names)
def test_a_part_is_id_safe_without_separator_and_short(name: str) -> None:
    part = encode_part(name)
    assert "." not in part
    assert len(part) <= 40
    assert all(c.isascii() and (c.isalnum() or c in "_:-") for c in part)


@given(names)
def test_a_part_decodes_back_unless_hashed(name: str) -> None:
    part = encode_part(name)
    decoded = decode_part(part)
    if part.startswith(":h"):
        assert decoded is None
    else:
        assert decoded == name


@given(names, names)
def test_different_names_make_different_parts(a: str, b: str) -> None:
    if a != b:
        assert encode_part(a) != encode_part(b)


@given(names, names, names)
@settings(max_examples=300)
def test_every_name_triple_is_a_valid_stratad_id(app: str, user: str, session: str) -> None:
    for key in (session_id_of(app, user, session), app_state_id(app), user_state_id(app, user)):
        assert validate_id(key, "session_id") == key


@given(names, names, names, names)
def test_the_user_prefix_lists_only_that_users_sessions(
    app: str, user: str, other: str, session: str
) -> None:
    prefix = f"adk.{encode_part(app)}.{encode_part(user)}."
    assert session_id_of(app, user, session).startswith(prefix)
    if other != user:
        assert not session_id_of(app, other, session).startswith(prefix)


def test_ordinary_names_stay_readable() -> None:
    assert (
        session_id_of("support", "user-42", "0b5f6c1e-2d3a") == "adk.support.user-42.0b5f6c1e-2d3a"
    )
    assert encode_part("ada@example.org") == "ada:40example:2eorg"
    assert encode_part("a b") == "a:20b"
    assert encode_part("") == ""
    assert encode_part("é") == ":c3:a9"


def test_long_names_are_hashed() -> None:
    part = encode_part("x" * 41)
    assert part.startswith(":h") and len(part) == 26
    assert encode_part("x" * 40) == "x" * 40


@pytest.mark.parametrize("bad", [":", ":2", ":zz", "a.b", "é", ":2E"])
def test_decoding_refuses_what_encoding_never_makes(bad: str) -> None:
    with pytest.raises(ValueError):
        decode_part(bad)


def event_line(text: str, **delta: object) -> bytes:
    event = Event(
        author="user",
        invocation_id="i",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
        actions=EventActions(state_delta=dict(delta)),
    )
    return event.model_dump_json(exclude_none=True).encode()


@pytest.mark.parametrize("count", [0, 1, 3])
def test_the_document_round_trips(count: int) -> None:
    lines = [event_line(f"line one\nline two {i}", n=i) for i in range(count)]
    state = json.dumps({"k": "v\n", "n": [1, 2]}, separators=(",", ":")).encode()
    meta = {"app_name": "a", "user_id": "u", "id": "s", "last_update_time": 1.5}
    data = encode_document(lines, state, meta)
    assert json.loads(data)["events"] == [json.loads(line) for line in lines]
    got_lines, got_state, got_meta = decode_document(data)
    assert got_lines == lines
    assert json.loads(got_state) == json.loads(state)
    assert got_meta == meta
    for line in got_lines:
        Event.model_validate_json(line)


def test_appending_keeps_every_earlier_byte() -> None:
    """What makes a step cost what it adds: the previous document, up to its last
    event, is a prefix of the next one."""
    lines = [event_line(f"message {i}") for i in range(5)]
    state = b"{}"
    before = encode_document(lines[:4], state, {"id": "s"})
    after = encode_document(lines, b'{"step":5}', {"id": "s"})
    kept = before[: before.index(b'\n],"state"')]
    assert after.startswith(kept)


def test_a_foreign_document_is_refused() -> None:
    with pytest.raises(ValueError):
        decode_document(b'{"messages": []}')
