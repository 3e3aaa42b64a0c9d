"""Is a whole structured state one the daemon can serve? (ReplaceStructuredState)

A replaced structured state bypasses the checks each facet's own RPCs make,
so before it is journaled every reader is run on it, as it would be served:
GetCognitiveState, GetCognitiveStats and BuildContext; ListTasks with
results and GetGlobalState; GetAgentState. A value any of them cannot serve is
refused with INVALID_ARGUMENT, naming the facet, rather than stored to fail
every later read.
"""

from __future__ import annotations

from typing import Any

from stratad.api.v1 import cognitive_pb2
from stratad.domain import agent, cognitive, tasks
from stratad.domain.models import SessionState, SessionStatus
from stratad.errors import InvalidArgumentError
from stratad.server.servicers import agent as agent_servicer
from stratad.server.servicers import cognitive as cognitive_servicer
from stratad.server.servicers import task as task_servicer
from stratad.values import to_value


def check_servable(session_id: str, structured: dict[str, Any]) -> None:
    state = SessionState(session_id, SessionStatus.ACTIVE, 1, {}, 0.0, 0.0)
    state.structured = structured
    for facet, serve in (("cognitive", _cognitive), ("tasks", _tasks), ("agent", _agent)):
        if facet not in structured:
            continue
        try:
            serve(state)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise InvalidArgumentError(
                f"structured_json: the {facet!r} facet is not one stratad can serve "
                f"({type(exc).__name__}: {exc})",
                metadata={"facet": facet},
            ) from None


def _cognitive(state: SessionState) -> None:
    cognitive_pb2.GetCognitiveStateResponse(
        state=cognitive_servicer.state_to_pb(cognitive.state_of(state))
    )
    facet = cognitive.facet_of(state)
    cognitive_pb2.GetCognitiveStatsResponse(**cognitive.stats_of("", state, facet))
    cognitive.build_context(facet, cognitive.DEFAULT_MAX_TOKENS)


def _tasks(state: SessionState) -> None:
    for task_id, task in tasks._tasks(state).items():
        task_servicer.task_to_pb(task_id, task, with_result=True)
    to_value(dict(tasks._globals(state)))


def _agent(state: SessionState) -> None:
    agent_servicer.state_to_pb(agent.facet_of(state))


__all__ = ["check_servable"]
