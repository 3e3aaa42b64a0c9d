"""How LangGraph's names become stratad IDs (see docs/langgraph.md).

Owns the mapping of a thread to its session (`session_id_of`, and the labels
that keep the thread ID on it) and of a LangGraph checkpoint ID to the stratad
checkpoint ID, unique in the tenant (`stratad_checkpoint_id`), and back
(`langgraph_checkpoint_id`). Stored data depends on it: never change it.
"""

from __future__ import annotations

import hashlib
import re

#: Session labels of the sessions this saver creates.
INTEGRATION_LABEL = "stratad.integration"
THREAD_LABEL = "langgraph.thread_id"

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
_REVERSIBLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,110}")
_SUFFIX = re.compile(r"(.+)\.[0-9a-f]{16}")


def session_id_of(thread_id: str, prefix: str = "") -> str:
    """The stratad session of a LangGraph thread."""
    candidate = f"{prefix}{thread_id}"
    if _ID.fullmatch(candidate):
        return candidate
    return f"{prefix}lg-{hashlib.blake2b(thread_id.encode(), digest_size=16).hexdigest()}"


def stratad_checkpoint_id(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> str:
    """The stratad checkpoint ID of a LangGraph checkpoint (unique in the tenant)."""
    scope = hashlib.blake2b(f"{thread_id}\0{checkpoint_ns}".encode(), digest_size=8).hexdigest()
    if _REVERSIBLE.fullmatch(checkpoint_id):
        return f"{checkpoint_id}.{scope}"
    whole = f"{thread_id}\0{checkpoint_ns}\0{checkpoint_id}".encode()
    return f"lgx-{hashlib.blake2b(whole, digest_size=16).hexdigest()}"


def langgraph_checkpoint_id(stratad_id: str) -> str | None:
    """The LangGraph checkpoint ID inside a stratad one (None: only its state has it)."""
    match = _SUFFIX.fullmatch(stratad_id)
    return match.group(1) if match else None
