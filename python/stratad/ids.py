"""Identifier rules shared by every service.

docs/design.md (API contract) allows `[A-Za-z0-9][A-Za-z0-9._:-]{0,127}`. stratad also
accepts `_` after the first character, because the documented examples of the
systems the compat facades reproduce use it (MARSYS's `session_123`, corteX's
`sess_001` and `crystal_{session_id}_{timestamp}`) and must run unchanged;
every ID the design allows is still allowed. No ID can contain a path
separator or start with a dot, so an ID is always safe as a file name.
"""

from __future__ import annotations

import os
import re
import time

from stratad.errors import InvalidArgumentError

_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def validate_id(value: str, what: str) -> str:
    """Return `value` if it is a valid ID, else raise INVALID_ARGUMENT naming `what`."""
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        shown = value if isinstance(value, str) and len(value) <= 64 else f"{str(value)[:64]}..."
        raise InvalidArgumentError(
            f"invalid {what} {shown!r}: an ID is 1-128 ASCII letters, digits, '_', '.', ':' "
            "or '-', starting with a letter or digit",
            reason="INVALID_ID",
        )
    return value


def new_id(prefix: str) -> str:
    """A time-ordered unique ID: `<prefix>-<ms timestamp hex><random hex>`."""
    return f"{prefix}-{int(time.time() * 1000):012x}{os.urandom(6).hex()}"
