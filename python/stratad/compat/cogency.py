"""Cogency's agent state on stratad's AgentStateService and ProfileService.

Cogency's agent loop runs unchanged against a daemon::

    from stratad.compat.cogency import AgentState, UserProfile

    profile = UserProfile.load("alice", address=ADDRESS)          # None if new
    state = AgentState(query="user query", user_id="alice", user_profile=profile,
                       address=ADDRESS)
    while state.execution.should_continue():
        prompt = state.get_situated_context() + state.reasoning.compress_for_context()
        state.update_from_reasoning(await llm.run(prompt))
        if state.execution.pending_calls:
            state.execution.finish_tools(await execute_tools(state.execution.pending_calls))
        state.execution.advance_iteration()

- ``AgentState(query, user_id, user_profile)`` starts an agent loop in a stratad
  session (``session_id``; a new one when empty, created on the daemon).
  ``AgentState.attach(session_id)`` picks up a running loop, e.g. after the
  agent process was restarted.
- ``state.execution`` and ``state.reasoning`` have Cogency's fields and
  methods (``should_continue``, ``set_tool_calls``, ``finish_tools``,
  ``advance_iteration``; ``learn``, ``update_facts``, ``record_thinking``,
  ``compress_for_context``). Each method is one atomic, journaled call; the
  fields read the state the daemon returned for the last call (``refresh()``
  fetches it again). Assigning ``execution.response``, ``execution.stop_reason``,
  ``reasoning.goal`` or ``reasoning.strategy`` is a call as well.
- ``stop_reason`` and ``response`` are ``None`` when unset, as in Cogency.
- Tool calls and results must be JSON objects; a call needs a string ``name``
  and, when given, object ``args`` (Cogency drops malformed calls; stratad
  refuses them with `stratad.errors.InvalidArgumentError`).
- ``UserProfile`` is a user's profile on the daemon (shared by all their
  sessions): ``update_from_interaction`` is Cogency's bounded merge done
  atomically on the daemon; ``compress(profile)`` is Cogency's compress().

Calls are blocking (Cogency's state methods are synchronous); failures are
`stratad.errors` classes.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable
from typing import Any

from stratad.api.v1 import agent_pb2 as apb
from stratad.api.v1 import agent_pb2_grpc, profile_pb2_grpc
from stratad.api.v1 import profile_pb2 as ppb
from stratad.errors import AlreadyExistsError, NotFoundError
from stratad.sdk.client import Client
from stratad.sdk.connection import TLSConfig
from stratad.sdk.constants import ADDRESS_ENV
from stratad.values import set_value, struct_to_py, to_py, to_struct

__all__ = [
    "ADDRESS_ENV",
    "AgentState",
    "ExecutionState",
    "ReasoningContext",
    "UserProfile",
    "compress",
]


def _client(address: str | None, tenant: str, client: Client | None, **credentials: Any) -> Client:
    """``client``, or a new one; ``credentials`` (token, tls) as `stratad.Client` takes them."""
    if client is not None:
        return client
    return Client(address, tenant=tenant, **credentials)


def _fact(key: str, value: Any) -> apb.Fact:
    fact = apb.Fact(key=key)
    set_value(fact.value, value)
    return fact


class ExecutionState:
    """Loop control and tool orchestration (Cogency's ExecutionState), on the daemon."""

    def __init__(self, owner: AgentState) -> None:
        self._owner = owner

    @property
    def _e(self) -> apb.ExecutionState:
        return self._owner._state.execution

    @property
    def query(self) -> str:
        return self._e.query

    @property
    def user_id(self) -> str:
        return self._e.user_id

    @property
    def iteration(self) -> int:
        return self._e.iteration

    @property
    def max_iterations(self) -> int:
        return self._e.max_iterations

    @property
    def mode(self) -> str:
        return self._e.mode

    @property
    def pending_calls(self) -> list[dict[str, Any]]:
        return [struct_to_py(c) for c in self._e.pending_calls]

    @property
    def completed_calls(self) -> list[dict[str, Any]]:
        return [struct_to_py(c) for c in self._e.completed_calls]

    @property
    def response(self) -> str | None:
        return self._e.response or None

    @response.setter
    def response(self, value: str) -> None:
        self._owner._apply(apb.ApplyReasoningRequest(response=value))

    @property
    def stop_reason(self) -> str | None:
        return self._e.stop_reason or None

    @stop_reason.setter
    def stop_reason(self, value: str) -> None:
        self._owner._call("StopAgent", apb.StopAgentRequest(stop_reason=value))

    def should_continue(self) -> bool:
        """iteration < max_iterations, no response, no stop_reason, calls pending."""
        return self._e.should_continue

    def set_tool_calls(self, calls: list[dict[str, Any]]) -> None:
        """Make `calls` the pending tool calls."""
        self._owner._apply(apb.ApplyReasoningRequest(tool_calls=[to_struct(c) for c in calls]))

    def finish_tools(self, results: list[dict[str, Any]]) -> None:
        """The results join the completed calls; nothing is pending any more."""
        request = apb.RecordToolResultsRequest(results=[to_struct(r) for r in results])
        self._owner._call("RecordToolResults", request)

    def advance_iteration(self) -> None:
        self._owner._call("AdvanceIteration", apb.AdvanceIterationRequest())


class ReasoningContext:
    """Structured reasoning memory (Cogency's ReasoningContext), on the daemon."""

    def __init__(self, owner: AgentState) -> None:
        self._owner = owner

    @property
    def _r(self) -> apb.ReasoningContext:
        return self._owner._state.reasoning

    @property
    def goal(self) -> str:
        return self._r.goal

    @goal.setter
    def goal(self, value: str) -> None:
        self._owner._apply(
            apb.ApplyReasoningRequest(context_updates=apb.ContextUpdates(goal=value))
        )

    @property
    def strategy(self) -> str:
        return self._r.strategy

    @strategy.setter
    def strategy(self, value: str) -> None:
        updates = apb.ContextUpdates(strategy=value)
        self._owner._apply(apb.ApplyReasoningRequest(context_updates=updates))

    @property
    def facts(self) -> dict[str, Any]:
        return {f.key: to_py(f.value) for f in self._r.facts}

    @property
    def insights(self) -> list[str]:
        return list(self._r.insights)

    @property
    def thoughts(self) -> list[dict[str, Any]]:
        return [
            {
                "thinking": t.thinking,
                "tool_calls": [struct_to_py(c) for c in t.tool_calls],
                "timestamp": t.timestamp,
            }
            for t in self._r.thoughts
        ]

    def learn(self, insight: str) -> None:
        """Add an insight: stripped, unique, the 10 newest kept."""
        updates = apb.ContextUpdates(insights=[insight])
        self._owner._apply(apb.ApplyReasoningRequest(context_updates=updates))

    def update_facts(self, key: str, value: Any) -> None:
        """Set a fact; the 20 most recently added keys are kept."""
        updates = apb.ContextUpdates(facts=[_fact(key, value)])
        self._owner._apply(apb.ApplyReasoningRequest(context_updates=updates))

    def record_thinking(self, thinking: str, tool_calls: list[dict[str, Any]]) -> None:
        """Record a reasoning step (the 5 newest are kept); the calls do not become pending."""
        request = apb.ApplyReasoningRequest(
            thinking=thinking, tool_calls=[to_struct(c) for c in tool_calls], record_only=True
        )
        self._owner._apply(request)

    def compress_for_context(self, max_tokens: int = 1000) -> str:
        """GOAL, STRATEGY, FACTS, INSIGHTS, LAST THINKING, cut to max_tokens characters."""
        request = apb.CompressContextRequest(max_tokens=max_tokens)
        return str(self._owner._call("CompressContext", request, keep_state=True).context)


class UserProfile:
    """A user's profile on the daemon (Cogency's UserProfile), shared by their sessions."""

    def __init__(
        self,
        user_id: str,
        *,
        address: str | None = None,
        tenant: str = "",
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        client: Client | None = None,
        _profile: ppb.UserProfile | None = None,
    ) -> None:
        self.user_id = user_id
        self._client = _client(address, tenant, client, token=token, tls=tls)
        self._stub = profile_pb2_grpc.ProfileServiceStub(self._client.channel)
        self._profile = _profile or ppb.UserProfile(user_id=user_id, synthesis_version=1)

    @classmethod
    def load(
        cls,
        user_id: str,
        *,
        address: str | None = None,
        tenant: str = "",
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        client: Client | None = None,
    ) -> UserProfile | None:
        """The user's stored profile, or None when they have none yet."""
        profile = cls(user_id, address=address, tenant=tenant, token=token, tls=tls, client=client)
        try:
            profile.refresh()
        except NotFoundError:
            return None
        return profile

    def refresh(self) -> None:
        request = ppb.GetProfileRequest(user_id=self.user_id)
        self._profile = self._client.call(self._stub.GetProfile, request).profile

    @property
    def preferences(self) -> dict[str, Any]:
        return {p.key: to_py(p.value) for p in self._profile.preferences}

    @property
    def goals(self) -> list[str]:
        return list(self._profile.goals)

    @property
    def expertise_areas(self) -> list[str]:
        return list(self._profile.expertise_areas)

    @property
    def communication_style(self) -> str:
        return self._profile.communication_style

    @property
    def projects(self) -> dict[str, str]:
        return {p.name: p.description for p in self._profile.projects}

    @property
    def interests(self) -> list[str]:
        return list(self._profile.interests)

    @property
    def constraints(self) -> list[str]:
        return list(self._profile.constraints)

    @property
    def success_patterns(self) -> list[str]:
        return list(self._profile.success_patterns)

    @property
    def failure_patterns(self) -> list[str]:
        return list(self._profile.failure_patterns)

    @property
    def interaction_count(self) -> int:
        return self._profile.interaction_count

    @property
    def synthesis_version(self) -> int:
        return self._profile.synthesis_version

    @property
    def created_at(self) -> float:
        return self._profile.created_at.ToNanoseconds() / 1e9

    @property
    def last_updated(self) -> float:
        return self._profile.last_updated.ToNanoseconds() / 1e9

    def update_from_interaction(
        self, interaction_insights: dict[str, Any], *, synthesized: bool = False
    ) -> None:
        """Cogency's bounded merge (preferences, goals, expertise, communication_style,
        project_context, success_pattern, failure_pattern; stratad adds interests and
        constraints), atomic on the daemon. `synthesized`: synthesis_version += 1."""
        i = interaction_insights
        request = ppb.UpdateProfileRequest(
            user_id=self.user_id,
            goals=i.get("goals", []),
            expertise=i.get("expertise", []),
            interests=i.get("interests", []),
            constraints=i.get("constraints", []),
            synthesized=synthesized,
        )
        for key, value in i.get("preferences", {}).items():
            pref = request.preferences.add(key=key)
            set_value(pref.value, value)
        for name, description in i.get("project_context", {}).items():
            request.project_context.add(name=name, description=description)
        for name in ("communication_style", "success_pattern", "failure_pattern"):
            if i.get(name) is not None:
                setattr(request, name, i[name])
        self._profile = self._client.call(self._stub.UpdateProfile, request).profile

    def update(self, interaction_insights: dict[str, Any]) -> None:
        self.update_from_interaction(interaction_insights)

    def delete(self) -> None:
        request = ppb.DeleteProfileRequest(user_id=self.user_id)
        self._client.call(self._stub.DeleteProfile, request)


def compress(profile: UserProfile, max_tokens: int = 800) -> str:
    """Cogency's compress(profile): COMMUNICATION, CURRENT GOALS, PREFERENCES, ACTIVE
    PROJECTS, EXPERTISE, CONSTRAINTS, cut to max_tokens characters (computed by the daemon)."""
    request = ppb.CompressProfileRequest(user_id=profile.user_id, max_tokens=max_tokens)
    return str(profile._client.call(profile._stub.CompressProfile, request).context)


class AgentState:
    """Execution state + reasoning context + situated memory of one agent loop."""

    def __init__(
        self,
        query: str,
        user_id: str = "default",
        user_profile: UserProfile | None = None,
        *,
        session_id: str = "",
        address: str | None = None,
        tenant: str = "",
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        max_iterations: int = 10,
        mode: str = "adapt",
        client: Client | None = None,
        _attach: bool = False,
    ) -> None:
        self._client = _client(address, tenant, client, token=token, tls=tls)
        self._stub = agent_pb2_grpc.AgentStateServiceStub(self._client.channel)
        self.session_id = session_id or f"agent_{uuid.uuid4().hex[:12]}"
        self.user_profile = user_profile
        self.execution = ExecutionState(self)
        self.reasoning = ReasoningContext(self)
        self._state = apb.AgentState()
        if _attach:
            self.refresh()
            return
        with contextlib.suppress(AlreadyExistsError):
            self._client.create_session(self.session_id, labels={"stratad.compat": "cogency"})
        self._call(
            "StartAgent",
            apb.StartAgentRequest(
                query=query, user_id=user_id, max_iterations=max_iterations, mode=mode
            ),
        )

    @classmethod
    def attach(
        cls,
        session_id: str,
        user_profile: UserProfile | None = None,
        *,
        address: str | None = None,
        tenant: str = "",
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        client: Client | None = None,
    ) -> AgentState:
        """The loop already running in `session_id` (NotFoundError, FailedPrecondition: none)."""
        return cls(
            "", user_profile=user_profile, session_id=session_id, address=address,
            tenant=tenant, token=token, tls=tls, client=client, _attach=True,
        )  # fmt: skip

    def _call(self, method: str, request: Any, *, keep_state: bool = False) -> Any:
        request.session_id = self.session_id
        response = self._client.call(getattr(self._stub, method), request)
        if not keep_state:
            self._state = response.state
        return response

    def _apply(self, request: apb.ApplyReasoningRequest) -> None:
        self._call("ApplyReasoning", request)

    def refresh(self) -> None:
        """Fetch the loop's state from the daemon (another process may have moved it on)."""
        self._call("GetAgentState", apb.GetAgentStateRequest())

    def close(self) -> None:
        self._client.close()

    def get_situated_context(self) -> str:
        """User context for prompt injection ("" without a profile)."""
        if not self.user_profile:
            return ""
        context = compress(self.user_profile)
        return f"USER CONTEXT:\n{context}\n\n" if context else ""

    def update_from_reasoning(self, reasoning_data: dict[str, Any]) -> None:
        """Record the thinking, set the tool calls, apply context updates and the response."""
        request = apb.ApplyReasoningRequest(thinking=reasoning_data.get("thinking", "") or "")
        request.tool_calls.extend(to_struct(c) for c in reasoning_data.get("tool_calls") or [])
        updates = reasoning_data.get("context_updates") or {}
        if "goal" in updates:
            request.context_updates.goal = updates["goal"]
        if "strategy" in updates:
            request.context_updates.strategy = updates["strategy"]
        if isinstance(updates.get("insights"), list):
            request.context_updates.insights.extend(updates["insights"])
        if isinstance(updates.get("facts"), dict):  # stratad: update_facts for each
            request.context_updates.facts.extend(_facts(updates["facts"].items()))
        if "response" in reasoning_data and reasoning_data["response"] is not None:
            request.response = reasoning_data["response"]
        self._apply(request)


def _facts(items: Iterable[tuple[str, Any]]) -> list[apb.Fact]:
    return [_fact(k, v) for k, v in items]
