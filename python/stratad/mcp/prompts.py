"""The MCP prompt: corteX's "Similar Past Success" crystal prompt for a goal.

``similar_past_success`` asks the daemon for the crystals that best match a goal
(QueryCrystals) and renders each with ApplyCrystal, in corteX's MemoryCrystallizer format::

    ## Similar Past Success (85% effective, used 3x)
    Goal pattern: Deploy {file_path} to {url}
    Approach: read config -> validate -> deploy -> verify
    Tools used: file_read, shell, browser
    Known pitfalls:
      - Timeout on large files: increase timeout to 60s
"""

from __future__ import annotations

from mcp_types import GetPromptResult, Prompt, PromptArgument, PromptMessage, TextContent

from stratad.api.v1 import crystal_pb2
from stratad.errors import InvalidArgumentError
from stratad.mcp.daemon import DaemonLink, Identity

NAME = "similar_past_success"
#: What the prompt says when no crystal matches the goal.
NO_MATCH = "No similar past success is stored for this goal yet."
MAX_GOAL = 8192


def prompts() -> list[Prompt]:
    return [
        Prompt(
            name=NAME,
            title="Similar past success",
            description="Approaches that worked on similar goals before (stratad crystals), "
            "best first, in the 'Similar Past Success' format: goal pattern, approach, tools "
            "used and known pitfalls, to follow as worked examples.",
            arguments=[
                PromptArgument(
                    name="goal", description="The goal about to be worked on.", required=True
                ),
                PromptArgument(
                    name="top_k",
                    description="How many past successes to include (1-10, default 1).",
                    required=False,
                ),
            ],
        )
    ]


async def get_prompt(
    link: DaemonLink, who: Identity, name: str, arguments: dict[str, str] | None
) -> GetPromptResult:
    if name != NAME:
        raise InvalidArgumentError(f"unknown prompt {name[:100]!r}", reason="UNKNOWN_PROMPT")
    args = arguments or {}
    unknown = sorted(set(args) - {"goal", "top_k"})
    if unknown:
        raise InvalidArgumentError(
            f"unknown prompt arguments: {', '.join(unknown)}", reason="INVALID_ARGUMENTS"
        )
    goal = args.get("goal", "")
    if not isinstance(goal, str) or not goal.strip() or len(goal) > MAX_GOAL:
        raise InvalidArgumentError(
            f"goal is required: the goal as text, at most {MAX_GOAL} characters",
            reason="INVALID_ARGUMENTS",
        )
    top_k_text = args.get("top_k") or "1"
    if (
        not isinstance(top_k_text, str)
        or not top_k_text.isdigit()
        or not 1 <= int(top_k_text) <= 10
    ):
        raise InvalidArgumentError(
            "top_k must be a whole number from 1 to 10", reason="INVALID_ARGUMENTS"
        )
    query = crystal_pb2.QueryCrystalsRequest(goal_text=goal, top_k=int(top_k_text))
    found = await link.call(link.crystals.QueryCrystals, query, who)
    sections = []
    for match in found.matches:
        apply = crystal_pb2.ApplyCrystalRequest(crystal_id=match.crystal.crystal_id, context=goal)
        sections.append((await link.call(link.crystals.ApplyCrystal, apply, who)).prompt)
    text = "\n\n".join(sections) if sections else NO_MATCH
    return GetPromptResult(
        description=f"Similar past successes for: {goal[:200]}",
        messages=[PromptMessage(role="user", content=TextContent(type="text", text=text))],
    )


__all__ = ["NAME", "NO_MATCH", "get_prompt", "prompts"]
