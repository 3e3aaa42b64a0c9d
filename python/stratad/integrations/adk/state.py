"""ADK state by scope, and state values as the JSON stratad stores.

Owns the split of a state (or an event's state delta) into its ``app:``,
``user:`` and session-scoped keys (``temp:`` keys are never stored), the merge
of the three back into a session's state, and the JSON form of the values
(what has none is stored as its string, as ADK's database services do).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.adk.sessions.state import State
from google.protobuf import struct_pb2
from pydantic_core import to_jsonable_python

#: The package's logger (named as when the service was one module).
logger = logging.getLogger("stratad.integrations.adk")


def _json_safe(value: Any) -> Any:
    """`value` as JSON data; what has no JSON form becomes its string (as ADK's
    database services store it), with a warning."""
    try:
        return to_jsonable_python(value)
    except Exception:
        logger.warning(
            "some state values are not JSON-serializable (e.g. callables) and are stored as "
            "their string representation",
            exc_info=True,
        )
        return to_jsonable_python(value, fallback=str)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True)
class _Scopes:
    """A state (or state delta) split by scope; ``temp:`` keys are dropped."""

    app: dict[str, Any]
    user: dict[str, Any]
    session: dict[str, Any]

    @classmethod
    def of(cls, state: Mapping[str, Any] | None) -> _Scopes:
        app: dict[str, Any] = {}
        user: dict[str, Any] = {}
        session: dict[str, Any] = {}
        for key, value in (state or {}).items():
            if key.startswith(State.APP_PREFIX):
                app[key.removeprefix(State.APP_PREFIX)] = value
            elif key.startswith(State.USER_PREFIX):
                user[key.removeprefix(State.USER_PREFIX)] = value
            elif not key.startswith(State.TEMP_PREFIX):
                session[key] = value
        return cls(app, user, session)


def _merged(
    session: Mapping[str, Any], app: Mapping[str, Any], user: Mapping[str, Any]
) -> dict[str, Any]:
    state = dict(session)
    state.update({State.APP_PREFIX + k: v for k, v in app.items()})
    state.update({State.USER_PREFIX + k: v for k, v in user.items()})
    return state


def _scope_values(value: struct_pb2.Value) -> dict[str, Any]:
    return {k: json.loads(v.string_value) for k, v in value.struct_value.fields.items()}
