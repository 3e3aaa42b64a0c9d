"""How ADK's names become stratad session IDs (see docs/adk.md).

Owns the encoding of an app, user or session name as a part of a stratad ID
(`encode_part`, `decode_part`) and the IDs built from them: an ADK session's
stratad session (`session_id_of`), the sessions holding the ``app:`` and
``user:`` state (`app_state_id`, `user_state_id`), and the prefix that lists an
app's or a user's sessions. Stored data depends on it: never change it.
"""

from __future__ import annotations

import hashlib
import string

_SAFE = frozenset(string.ascii_letters + string.digits + "_-")
_HEX = frozenset("0123456789abcdef")
#: An encoded part longer than this is hashed: three parts and the prefix stay
#: within stratad's 128 characters.
_PART_BUDGET = 40
_SEP = "."


def encode_part(value: str) -> str:
    """One name (app, user or session ID) as a piece of a stratad ID.

    ASCII letters, digits, ``_`` and ``-`` are kept; any other character is
    ``:`` and two lowercase hex digits per UTF-8 byte (``.`` and ``:``
    included), so the result has no ``.`` and decodes back (`decode_part`). A
    result longer than 40 characters is ``:h`` and 24 hex digits of a BLAKE2b
    hash instead (the labels keep the name)."""
    out = "".join(c if c in _SAFE else "".join(f":{b:02x}" for b in c.encode()) for c in value)
    if len(out) > _PART_BUDGET:
        return ":h" + hashlib.blake2b(value.encode(), digest_size=12).hexdigest()
    return out


def decode_part(part: str) -> str | None:
    """The name `encode_part` encoded as `part`; None for a hashed one."""
    if part.startswith(":h"):
        return None
    raw = bytearray()
    i = 0
    while i < len(part):
        c = part[i]
        if c == ":":
            pair = part[i + 1 : i + 3]
            if len(pair) != 2 or not set(pair) <= _HEX:
                raise ValueError(f"not an encoded name: {part!r}")
            raw.append(int(pair, 16))
            i += 3
        elif c in _SAFE:
            raw += c.encode()
            i += 1
        else:
            raise ValueError(f"not an encoded name: {part!r}")
    return raw.decode()


def session_id_of(app_name: str, user_id: str, session_id: str) -> str:
    """The stratad session of an ADK session."""
    return _SEP.join(("adk", encode_part(app_name), encode_part(user_id), encode_part(session_id)))


def app_state_id(app_name: str) -> str:
    """The stratad session holding an app's ``app:`` state."""
    return f"adk-app.{encode_part(app_name)}"


def user_state_id(app_name: str, user_id: str) -> str:
    """The stratad session holding a user's ``user:`` state in an app."""
    return f"adk-user.{encode_part(app_name)}.{encode_part(user_id)}"


def _sessions_prefix(app_name: str, user_id: str | None) -> str:
    parts = ["adk", encode_part(app_name)]
    if user_id is not None:
        parts.append(encode_part(user_id))
    return _SEP.join(parts) + _SEP
