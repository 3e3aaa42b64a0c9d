"""A structural diff of two JSON values: which paths were added, removed or changed.

Objects are compared key by key, arrays index by index (an element inserted
at the front shows as every later index changed, plus one added at the end:
that is what an index-addressed reader of the state sees). A value whose type
changed (object to array, 1 to "1", 1 to 1.0) is one change at its path.

The walk uses an explicit stack, not recursion, so a deeply nested state
cannot exhaust Python's recursion limit, and it stops after ``limit`` changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Op = Literal["added", "removed", "changed"]
Path = tuple[str | int, ...]

#: Changes listed at most; the rest are counted as truncated.
DEFAULT_LIMIT = 1000
#: Characters of a value shown before and after a change.
PREVIEW_CHARS = 2000


@dataclass(frozen=True, slots=True)
class Change:
    op: Op
    path: Path
    before: Any = None
    after: Any = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "op": self.op,
            "path": list(self.path),
            "pointer": pointer(self.path),
        }
        if self.op != "added":
            out["before"] = preview(self.before)
        if self.op != "removed":
            out["after"] = preview(self.after)
        return out


def diff(a: Any, b: Any, limit: int = DEFAULT_LIMIT) -> tuple[list[Change], bool]:
    """The changes from ``a`` to ``b``; True if cut at ``limit``.

    Keys and indexes are visited in order; an object's or array's own additions
    and removals come before the changes nested inside its other members.
    """
    changes: list[Change] = []
    stack: list[tuple[Path, Any, Any]] = [((), a, b)]
    while stack:
        path, x, y = stack.pop()
        if _same_scalar(x, y):
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            children = _object_children(path, x, y, changes)
        elif isinstance(x, list) and isinstance(y, list):
            children = _array_children(path, x, y, changes)
        else:
            changes.append(Change("changed", path, x, y))
            children = []
        if len(changes) >= limit:
            return changes[:limit], True
        stack.extend(reversed(children))  # pop in document order
    return changes, False


def _same_scalar(x: Any, y: Any) -> bool:
    # type() too: in Python True == 1 == 1.0, in JSON they are different values.
    return type(x) is type(y) and not isinstance(x, dict | list) and x == y


def _object_children(
    path: Path, x: dict[str, Any], y: dict[str, Any], changes: list[Change]
) -> list[tuple[Path, Any, Any]]:
    children = []
    for key in sorted(x.keys() | y.keys()):
        if key not in y:
            changes.append(Change("removed", (*path, key), before=x[key]))
        elif key not in x:
            changes.append(Change("added", (*path, key), after=y[key]))
        else:
            children.append(((*path, key), x[key], y[key]))
    return children


def _array_children(
    path: Path, x: list[Any], y: list[Any], changes: list[Change]
) -> list[tuple[Path, Any, Any]]:
    common = min(len(x), len(y))
    changes.extend(Change("removed", (*path, i), before=x[i]) for i in range(common, len(x)))
    changes.extend(Change("added", (*path, i), after=y[i]) for i in range(common, len(y)))
    return [((*path, i), x[i], y[i]) for i in range(common)]


def pointer(path: Path) -> str:
    """The RFC 6901 JSON Pointer of ``path`` ("" is the whole document)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def preview(value: Any) -> str:
    """``value`` as compact JSON, cut to PREVIEW_CHARS characters."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


__all__ = ["Change", "diff", "pointer", "preview"]
