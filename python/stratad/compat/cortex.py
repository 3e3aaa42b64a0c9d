"""corteX's cognitive state and memory (StateFileManager, MemoryCrystallizer) on stratad.

Code written against corteX moves to stratad by changing its imports (and
naming the daemon's address, or setting ``STRATAD_ADDRESS``):

- ``from stratad.compat.cortex import MemoryCrystallizer, Crystal`` replaces
  ``from corteX.engine.cognitive.crystallizer import ...`` (see below);
- ``from stratad.compat.cortex import StateFileManager`` replaces
  ``from corteX.engine.cognitive.state_files import StateFileManager``; see
  `stratad.compat.cortex_state` for how the three layers live in the daemon.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stratad import crystal_format
from stratad.api.v1 import crystal_pb2, crystal_pb2_grpc
from stratad.compat.cortex_state import (
    CrystallizedState,
    FluidState,
    InsightState,
    StateFileManager,
)
from stratad.errors import InvalidArgumentError, NotFoundError
from stratad.sdk.client import Client
from stratad.sdk.connection import TLSConfig
from stratad.sdk.constants import ADDRESS_ENV

# =====================================================================================
# corteX's MemoryCrystallizer and Crystal: crystals in the daemon's CrystalService
# =====================================================================================
#
#     from stratad.compat.cortex import MemoryCrystallizer
#
#     crystallizer = MemoryCrystallizer(max_crystals=200, address="127.0.0.1:50051")
#     crystal = crystallizer.crystallize(goal, execution_trace, 0.9, session_id="sess_001")
#     for match in crystallizer.query("Deploy server.py to staging"):
#         print(crystallizer.apply(match))
#
# The library lives in the daemon, one per tenant (``tenant``; empty: the daemon's
# default), persistent and shared by every MemoryCrystallizer of that tenant, in
# any process. Behaviour, thresholds, limits and output formats are corteX's;
# docs/crystals.md has the precise rules. Differences that follow from that:
#
# - Constructing a MemoryCrystallizer sets the tenant library's ``max_crystals``
#   (lowering it evicts the least effective crystals at once); use a tenant per
#   library when several limits are wanted. ``min_success_score`` is this
#   object's own and is sent with every ``crystallize``.
# - ``crystallize`` returns None when the score is below the minimum or a
#   similar crystal exists (as in corteX); ``last_result`` holds the daemon's
#   CrystallizeResponse (its outcome, and the similar crystal's ID).
# - Trace steps are dicts with ``decision``, ``tool``, ``error`` and
#   ``resolution`` keys; other keys are ignored, values are converted with
#   ``str`` and None is an absent key.
# - ``apply`` formats the Crystal it is given (no daemon call); ``record_reuse``
#   of an unknown crystal does nothing and ``get_crystal`` returns None for it, as
#   corteX's dict lookups would.
# - Failures to reach the daemon are `stratad.errors` exceptions (for example
#   `~stratad.errors.UnavailableError`); invalid arguments raise
#   `~stratad.errors.InvalidArgumentError`.


@dataclass
class Crystal:
    """A reusable cognitive pattern extracted from a successful execution."""

    crystal_id: str
    goal_template: str
    decision_chain: list[str] = field(default_factory=list)
    tool_sequence: list[str] = field(default_factory=list)
    error_patterns: list[dict[str, str]] = field(default_factory=list)
    success_score: float = 0.0
    reuse_count: int = 0
    effectiveness: float = 0.0
    entity_types: list[str] = field(default_factory=list)
    created_from: str = ""
    created_at: float = 0.0


def _crystal_of(pb: crystal_pb2.Crystal) -> Crystal:
    return Crystal(
        crystal_id=pb.crystal_id,
        goal_template=pb.goal_template,
        decision_chain=list(pb.decision_chain),
        tool_sequence=list(pb.tool_sequence),
        error_patterns=[{"error": p.error, "resolution": p.resolution} for p in pb.error_patterns],
        success_score=pb.success_score,
        reuse_count=pb.reuse_count,
        effectiveness=pb.effectiveness,
        entity_types=list(pb.entity_types),
        created_from=pb.created_from,
        created_at=pb.created_at.seconds + pb.created_at.nanos / 1e9,
    )


def _step(step: Mapping[str, Any]) -> crystal_pb2.TraceStep:
    def text(key: str) -> str:
        value = step.get(key)
        return "" if value is None else str(value)

    return crystal_pb2.TraceStep(
        decision=text("decision"),
        tool=text("tool"),
        error=text("error"),
        resolution=text("resolution"),
    )


class MemoryCrystallizer:
    """Distills reusable patterns from successful task completions (corteX's API)."""

    def __init__(
        self,
        max_crystals: int = 200,
        min_success_score: float = 0.7,
        *,
        address: str | None = None,
        tenant: str = "",
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.max_crystals = max_crystals
        self.min_success_score = min_success_score
        self.last_result: crystal_pb2.CrystallizeResponse | None = None
        # None or empty: the STRATAD_* variables (stratad.sdk.connection).
        self._client = Client(address, tenant=tenant, token=token, tls=tls, timeout=timeout)
        self._stub = crystal_pb2_grpc.CrystalServiceStub(self._client.channel)
        try:
            self._call(
                self._stub.SetCrystalLibraryConfig,
                crystal_pb2.SetCrystalLibraryConfigRequest(max_crystals=max_crystals),
            )
        except BaseException:
            self._client.close()
            raise

    def _call(self, method: Any, request: Any) -> Any:
        return self._client.call(method, request)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> MemoryCrystallizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def crystallize(
        self,
        goal: str,
        execution_trace: Sequence[Mapping[str, Any]],
        success_score: float,
        session_id: str = "",
    ) -> Crystal | None:
        """Extract a crystal from a successful task execution; None if the score is
        below the minimum or the pattern is not novel enough."""
        request = crystal_pb2.CrystallizeRequest(
            goal=goal,
            execution_trace=[_step(step) for step in execution_trace],
            success_score=success_score,
            session_id=session_id,
            min_success_score=self.min_success_score,
        )
        response = self._call(self._stub.Crystallize, request)
        self.last_result = response
        if response.outcome != crystal_pb2.CRYSTALLIZE_OUTCOME_CREATED:
            return None
        return _crystal_of(response.crystal)

    def query(self, goal_text: str, top_k: int = 3) -> list[Crystal]:
        """Matching crystals by keyword similarity, best first (boosted by effectiveness)."""
        if top_k <= 0:
            return []
        top_k = min(top_k, crystal_format.MAX_TOP_K)  # the daemon's limit; corteX has none
        request = crystal_pb2.QueryCrystalsRequest(goal_text=goal_text, top_k=top_k)
        response = self._call(self._stub.QueryCrystals, request)
        return [_crystal_of(match.crystal) for match in response.matches]

    def apply(self, crystal: Crystal, context: str = "") -> str:
        """A few-shot prompt (markdown) from `crystal`; `context` is not used."""
        return crystal_format.format_prompt(
            goal_template=crystal.goal_template,
            decision_chain=crystal.decision_chain,
            tool_sequence=crystal.tool_sequence,
            error_patterns=(
                (p.get("error", ""), p.get("resolution", "")) for p in crystal.error_patterns
            ),
            effectiveness=crystal.effectiveness,
            reuse_count=crystal.reuse_count,
        )

    def record_reuse(self, crystal_id: str, success: bool) -> None:
        """Update effectiveness (running average) after a crystal is reused."""
        request = crystal_pb2.RecordReuseRequest(crystal_id=crystal_id, success=success)
        try:
            self._call(self._stub.RecordReuse, request)
        except (NotFoundError, InvalidArgumentError):
            return  # no such crystal (an invalid ID cannot name one)

    def get_crystal(self, crystal_id: str) -> Crystal | None:
        """The crystal with this ID, or None."""
        request = crystal_pb2.GetCrystalRequest(crystal_id=crystal_id)
        try:
            response = self._call(self._stub.GetCrystal, request)
        except (NotFoundError, InvalidArgumentError):
            return None
        return _crystal_of(response.crystal)

    def get_stats(self) -> dict[str, Any]:
        """``total_crystals``, ``effective_crystals``, ``total_reuses``, ``avg_effectiveness``."""
        stats = self._call(self._stub.GetCrystalStats, crystal_pb2.GetCrystalStatsRequest())
        return {
            "total_crystals": stats.total_crystals,
            "effective_crystals": stats.effective_crystals,
            "total_reuses": stats.total_reuses,
            "avg_effectiveness": stats.avg_effectiveness,
        }


# =====================================================================================
# corteX's StateFileManager: implemented in stratad.compat.cortex_state
# =====================================================================================

__all__ = [
    "ADDRESS_ENV",
    "Crystal",
    "CrystallizedState",
    "FluidState",
    "InsightState",
    "MemoryCrystallizer",
    "StateFileManager",
]
