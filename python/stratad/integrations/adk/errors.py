"""Failures as ADK raises them, and when a session object is stale.

Owns `adk_error` (an exception that is both the ADK error ADK's callers catch
and the `stratad.errors` class of the failure) and the check that refuses an
append to a session object older than what is stored (ADK's
`StaleSessionError`, as DatabaseSessionService raises it).
"""

from __future__ import annotations

import threading
from typing import Any

from google.adk.errors import StaleSessionError
from google.adk.sessions.session import Session

from stratad.errors import StratadError, VersionConflictError
from stratad.integrations.adk.document import _Stored

_STALE_MESSAGE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)

_ERROR_CLASSES: dict[tuple[type[Exception], type[StratadError]], type[Exception]] = {}
_ERROR_CLASSES_LOCK = threading.Lock()


def adk_error(adk_class: type[Exception], exc: StratadError, message: str = "") -> Exception:
    """`exc` as an exception that is both `adk_class` (what ADK's callers
    catch) and `exc`'s own `stratad.errors` class (reason and metadata kept)."""
    base = type(exc)
    with _ERROR_CLASSES_LOCK:
        cls = _ERROR_CLASSES.get((adk_class, base))
        if cls is None:
            name = f"{adk_class.__name__}From{base.__name__}"

            def __init__(self: Any, message: str, reason: str, metadata: dict[str, str]) -> None:
                StratadError.__init__(self, message, reason=reason, metadata=metadata)

            def __str__(self: Any) -> str:
                return str(self.message)

            cls = type(name, (adk_class, base), {"__init__": __init__, "__str__": __str__})
            cls.__module__ = "stratad.integrations.adk"
            _ERROR_CLASSES[(adk_class, base)] = cls
    error = cls(message or exc.message, exc.reason, exc.metadata)  # type: ignore[call-arg]
    return error


def _marker(session: Session) -> int | None:
    """The stratad version a session object was read or written at (None: unknown)."""
    marker = session._storage_update_marker
    if marker is None:
        return None
    try:
        return int(marker)
    except ValueError:
        return None


def _check_not_stale(session: Session, marker: int | None, stored: _Stored) -> None:
    """Refuse to append to a session object older than what is stored."""
    if marker is not None:
        if marker != stored.version:
            raise adk_error(
                StaleSessionError,
                VersionConflictError(
                    f"session version {stored.version}, not {marker}",
                    reason="VERSION_CONFLICT",
                    metadata={"expected": str(marker), "actual": str(stored.version)},
                ),
                _STALE_MESSAGE,
            )
        return
    # No marker (a session object built by hand): as DatabaseSessionService,
    # stale only when storage moved past it and its last event is not the
    # stored last event.
    if stored.last_update_time > session.last_update_time:
        last = session.events[-1].id if session.events else None
        if last != stored.last_event_id():
            raise adk_error(
                StaleSessionError,
                VersionConflictError("the session's last event is not the stored one"),
                _STALE_MESSAGE,
            )
