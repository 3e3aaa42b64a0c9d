"""A Google ADK session service that keeps sessions in a stratad daemon.

    from stratad.integrations.adk import StratadSessionService

    runner = Runner(app_name="support", agent=agent,
                    session_service=StratadSessionService("127.0.0.1:50051"))

`StratadSessionService` implements ADK's `BaseSessionService` (create, get,
list and delete a session, `append_event` with its state delta, `get_user_state`)
with ADK's semantics for the `app:`, `user:` and `temp:` state scopes and
`GetSessionConfig`'s filters. How it maps onto stratad (see docs/adk.md):

- an ADK session (app, user, session ID) is one stratad session,
  ``adk.<app>.<user>.<session>``: each part is kept as it is when it is made of
  ASCII letters, digits, ``_`` and ``-``, other characters are escaped as
  ``:<hex of each UTF-8 byte>`` (``.`` is the separator, so an encoded part has
  none), and a part longer than 40 characters once encoded is ``:h<hash>``; the
  labels keep the original names;
- the session is one state: its events (one JSON object a line, in the order
  they were appended), then its session-scoped state and the session's times.
  Every `append_event` saves the whole document as a new checkpoint,
  conditional on the session's version (``expected_version``). The events are a
  prefix that only grows, so stratad's content-defined chunking and delta
  frames store (and the SDK uploads) about what the step added, not the
  history again;
- ``app:`` keys live in the global state (TaskService) of the stratad session
  ``adk-app.<app>``, ``user:`` keys in that of ``adk-user.<app>.<user>``: one
  MERGE per scope and event, applied atomically by the daemon (just before the
  event is saved), so writers in any number of processes never lose each
  other's keys; ``temp:`` keys are
  never stored (they stay in the in-memory session of the invocation, as ADK
  does);
- a session object carries the stratad version it was read or written at
  (ADK's storage marker): appending to an older copy of a session raises ADK's
  `StaleSessionError`, as DatabaseSessionService does; an event equal to one
  among the last 256 KiB of stored events (a retried append, an event
  delivered twice) is not stored again.

Errors: the ones ADK defines are raised as classes that are both the ADK error
and the `stratad.errors` class of the failure (`AlreadyExistsError`,
`SessionNotFoundError`, `StaleSessionError`; an invalid argument is a
`ValueError`); `get_session` of an unknown session is None and deleting one is
a no-op, as in ADK's own services; other failures (`UnavailableError`,
`DataLossError`, ...) are raised as the `stratad.errors` class they are.

Every call runs a blocking `stratad.Client` in a worker thread, so one service
serves every event loop (ADK's `Runner.run` starts one per call).

The package, by concern (each module says what it owns):

- service.py: `StratadSessionService`, what ADK calls;
- store.py: its storage (documents, app and user state) over a `stratad.Client`;
- document.py: a session as one stored JSON document;
- names.py: ADK names as stratad session IDs;
- state.py: state by scope, values as JSON;
- errors.py: failures as ADK's errors, stale session objects.
"""

from __future__ import annotations

from stratad.integrations.adk.document import CONTENT_TYPE
from stratad.integrations.adk.document import DEDUP_WINDOW_BYTES as DEDUP_WINDOW_BYTES
from stratad.integrations.adk.document import decode_document as decode_document
from stratad.integrations.adk.document import encode_document as encode_document
from stratad.integrations.adk.errors import adk_error as adk_error
from stratad.integrations.adk.names import (
    app_state_id,
    decode_part,
    encode_part,
    session_id_of,
    user_state_id,
)
from stratad.integrations.adk.service import MAX_ATTEMPTS as MAX_ATTEMPTS
from stratad.integrations.adk.service import StratadSessionService
from stratad.integrations.adk.state import logger as logger
from stratad.integrations.adk.store import APP_LABEL as APP_LABEL
from stratad.integrations.adk.store import INTEGRATION_LABEL as INTEGRATION_LABEL
from stratad.integrations.adk.store import KEEP_LABEL as KEEP_LABEL
from stratad.integrations.adk.store import SCOPE_KEY as SCOPE_KEY
from stratad.integrations.adk.store import SESSION_LABEL as SESSION_LABEL
from stratad.integrations.adk.store import STATE_IN_METADATA_BYTES as STATE_IN_METADATA_BYTES
from stratad.integrations.adk.store import USER_LABEL as USER_LABEL

__all__ = [
    "CONTENT_TYPE",
    "StratadSessionService",
    "app_state_id",
    "decode_part",
    "encode_part",
    "session_id_of",
    "user_state_id",
]
