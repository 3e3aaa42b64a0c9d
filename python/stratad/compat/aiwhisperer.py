"""AIWhisperer's state management functions on stratad.

The seed saves the runner's state dict as a JSON file (temp file + rename for
atomicity, a file lock against concurrent writers). Here the same calls keep
it in a stratad daemon::

    from stratad.compat import aiwhisperer

    aiwhisperer.configure(address="127.0.0.1:50051")   # or set STRATAD_ADDRESS
    aiwhisperer.save_state(state, "run/state.json")
    state = aiwhisperer.load_state("run/state.json")

- **Paths become sessions.** ``file_path`` names a stratad session through
  `session_id_for`: ``aiwhisperer:<file name>:<16 hex>``, where the file name is
  sanitized to ID characters (others become ``_``, at most 64 kept) and the hex
  is the start of the BLAKE3 of the absolute, normalized path. Readable, yet two
  files of the same name in different directories never share state. Spellings
  of one path (relative or absolute, ``a/../b``) map to the same session;
  symlinks are not resolved. No file is read or written.
- **Each save is a checkpoint.** ``save_state`` stores ``json.dumps(state)`` as a
  new checkpoint (content type ``application/vnd.aiwhisperer.state+json``),
  creating the session on first use with ``keep_last`` checkpoints of history
  and the labels ``stratad.compat=aiwhisperer`` and ``path=<absolute path>``.
  ``load_state`` returns the newest.
- **Atomicity and locking come from stratad:** a save is one journaled,
  fsynced record, and concurrent writers of a session are serialized by the
  daemon, so a reader sees one whole state or the previous one, never a mix.
- **Errors keep the file API's shape where the seed's callers rely on it:**
  ``load_state`` of a path never saved raises ``FileNotFoundError`` (errno
  ENOENT, ``filename`` set), as opening the missing file would; a state that
  is not JSON-serializable raises ``TypeError`` as ``json.dump`` does. Other
  failures are `stratad.errors` classes (e.g. `~stratad.errors.UnavailableError`
  when no daemon answers, `~stratad.errors.DataLossError` for damaged bytes).

The module uses one blocking `stratad.Client`, created on first use from
`configure`'s settings, or else from the ``STRATAD_ADDRESS`` environment
variable (default ``127.0.0.1:50051``) and the default tenant.

The seed's task and global-state helpers (``update_task_status``,
``store_task_result``, ``get_task_result``, ``update_global_state``,
``get_global_state``) belong in this module too, next to these two functions;
they are not implemented yet.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import threading
from dataclasses import dataclass
from typing import Any

from stratad import native
from stratad.errors import AlreadyExistsError, NotFoundError
from stratad.sdk.client import DEFAULT_ADDRESS, Client

__all__ = [
    "ADDRESS_ENV",
    "CONTENT_TYPE",
    "close",
    "configure",
    "load_state",
    "save_state",
    "session_id_for",
]

ADDRESS_ENV = "STRATAD_ADDRESS"
CONTENT_TYPE = "application/vnd.aiwhisperer.state+json"
SESSION_PREFIX = "aiwhisperer:"
DEFAULT_KEEP_LAST = 10

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_NAME_CHARS = 64
_DIGEST_CHARS = 16

StrPath = str | os.PathLike[str]


@dataclass(frozen=True)
class _Settings:
    address: str
    tenant: str
    keep_last: int


_lock = threading.Lock()
_settings: _Settings | None = None
_client: Client | None = None


# -- configuration -------------------------------------------------------------------


def configure(address: str | None = None, tenant: str = "", *, keep_last: int = 10) -> None:
    """Point the module at a daemon (``address`` None: ``$STRATAD_ADDRESS`` or
    ``127.0.0.1:50051``) acting as ``tenant`` (empty: the daemon's default).

    ``keep_last`` is the checkpoint history kept per path (0 keeps all); it
    applies to sessions created from now on. Any open connection is closed.
    """
    if keep_last < 0:
        raise ValueError("keep_last must not be negative")
    global _settings
    with _lock:
        _close_locked()
        _settings = _Settings(address or _default_address(), tenant, keep_last)


def close() -> None:
    """Close the module's connection; the next call opens a new one."""
    with _lock:
        _close_locked()


def _close_locked() -> None:
    global _client
    if _client is not None:
        _client.close()
        _client = None


def _default_address() -> str:
    return os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS


def _current() -> tuple[Client, _Settings]:
    """The module's client and settings, created on first use (thread-safe)."""
    global _client, _settings
    with _lock:
        if _settings is None:
            _settings = _Settings(_default_address(), "", DEFAULT_KEEP_LAST)
        if _client is None:
            _client = Client(_settings.address, tenant=_settings.tenant)
        return _client, _settings


# -- paths ---------------------------------------------------------------------------------


def _absolute(file_path: StrPath) -> str:
    return os.path.abspath(os.fsdecode(file_path))


def session_id_for(file_path: StrPath) -> str:
    """The stratad session that stands for `file_path` (see the module docstring)."""
    full = _absolute(file_path)
    name = _UNSAFE.sub("_", os.path.basename(full))[:_NAME_CHARS] or "root"
    digest = native.digest_hex(full.encode("utf-8", "surrogateescape"))[:_DIGEST_CHARS]
    return f"{SESSION_PREFIX}{name}:{digest}"


# -- the seed's API ----------------------------------------------------------------------------


def save_state(state: dict[str, Any], file_path: StrPath) -> None:
    """Save the state dict as JSON under `file_path` (a new checkpoint of its session)."""
    data = json.dumps(state).encode("utf-8")
    client, settings = _current()
    session_id = session_id_for(file_path)
    try:
        client.save_state(session_id, data, content_type=CONTENT_TYPE)
        return
    except NotFoundError:
        pass
    labels = {"stratad.compat": "aiwhisperer", "path": _absolute(file_path)}
    with contextlib.suppress(AlreadyExistsError):  # another writer created it meanwhile
        client.create_session(session_id, labels=labels, keep_last=settings.keep_last)
    client.save_state(session_id, data, content_type=CONTENT_TYPE)


def load_state(file_path: StrPath) -> dict[str, Any]:
    """The state dict last saved under `file_path`; FileNotFoundError if none was."""
    client, _ = _current()
    try:
        loaded = client.load_state(session_id_for(file_path))
    except NotFoundError:
        raise FileNotFoundError(
            errno.ENOENT, "no state saved in stratad for this path", os.fsdecode(file_path)
        ) from None
    state = json.loads(loaded.data)
    if not isinstance(state, dict):
        raise ValueError(f"the state saved for {os.fsdecode(file_path)!r} is not a JSON object")
    return state
