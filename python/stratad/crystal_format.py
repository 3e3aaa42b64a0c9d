"""What the daemon and the corteX facade must agree on about crystals: the
few-shot prompt a crystal becomes (corteX's ``MemoryCrystallizer.apply``
output) and the largest ``top_k`` a query may ask for.

Pure (no storage, no gRPC): `stratad.domain.crystals` builds its prompts with
it, and `stratad.compat.cortex`, a client, formats a crystal it holds without
importing the daemon's domain layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: The most crystals one query returns (CrystalService.QueryCrystals refuses more).
MAX_TOP_K = 1000


def format_prompt(
    *,
    goal_template: str,
    decision_chain: Sequence[str],
    tool_sequence: Sequence[str],
    error_patterns: Iterable[tuple[str, str]],
    effectiveness: float,
    reuse_count: int,
) -> str:
    """corteX's ``apply`` output: a few-shot prompt in markdown.

    Lines whose list is empty (Approach, Tools used, Known pitfalls) are left out;
    a pitfall (error, resolution) without a resolution is shown without the
    ``: resolution`` part.
    """
    lines = [
        f"## Similar Past Success ({effectiveness:.0%} effective, used {reuse_count}x)",
        f"Goal pattern: {goal_template}",
    ]
    if decision_chain:
        lines.append(f"Approach: {' -> '.join(decision_chain)}")
    if tool_sequence:
        lines.append(f"Tools used: {', '.join(tool_sequence)}")
    pitfalls = list(error_patterns)
    if pitfalls:
        lines.append("Known pitfalls:")
        for error, resolution in pitfalls:
            suffix = f": {resolution}" if resolution else ""
            lines.append(f"  - {error}{suffix}")
    return "\n".join(lines)


__all__ = ["MAX_TOP_K", "format_prompt"]
