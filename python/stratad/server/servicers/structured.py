"""Is a whole structured state one the daemon can serve? (ReplaceStructuredState)

A replaced structured state bypasses the checks each facet's own RPCs make,
so before it is journaled each facet it holds is parsed against the facet's
type (`cognitive.parse`, `tasks.parse`, `agent.parse`: types, required and
unknown keys, ranges and the bounds the RPCs keep). A facet that does not
parse is refused with INVALID_ARGUMENT naming the facet and the field, rather
than stored to fail later reads (or the facet's next update).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from stratad.domain import agent, cognitive, tasks
from stratad.errors import InvalidArgumentError

#: Each facet's parse (structured.FACETS, in order).
PARSERS: dict[str, Callable[[object], object]] = {
    cognitive.FACET: cognitive.parse,
    tasks.FACET: tasks.parse,
    agent.FACET: agent.parse,
}


def check_servable(session_id: str, structured: Mapping[str, object]) -> None:
    """Refuse `structured` (session `session_id`'s, as sent) unless every facet parses."""
    for facet, parse in PARSERS.items():
        if facet not in structured:
            continue
        try:
            parse(structured[facet])
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(
                f"structured_json: the {facet!r} facet is not one stratad can serve: {exc.message}",
                metadata={**exc.metadata, "facet": facet},
            ) from None


__all__ = ["PARSERS", "check_servable"]
