"""The crystal itself: types, limits, input validation and the extraction rules.

Crystal memory is corteX's ``MemoryCrystallizer`` as a service:
reusable patterns extracted from successful runs, one library per tenant (user
guide: docs/crystals.md). This module is the part that needs no storage: what a
crystal is, what input is accepted, and corteX's pure logic, with stratad's
precise definitions:

- **Crystallize** stores nothing when ``success_score < min_success_score``
  (default 0.7). Otherwise it extracts a crystal: ``goal_template`` is
  ``native.generalize_goal(goal)``; ``decision_chain`` the first 20 non-empty
  decisions; ``tool_sequence`` the first 15 distinct non-empty tools in order of
  first use; ``error_patterns`` the first 10 steps with a non-empty error, with
  their resolution ("" if none); ``entity_types`` ``native.detect_entity_types(goal)``.
- **Novelty**: the new crystal is rejected when an existing one has tool-sequence
  Jaccard > 0.8 *and* goal-template word overlap > 0.7 (both strictly). Tool
  Jaccard is over the *sets* of tool names (exact strings); word overlap is the
  Jaccard of the sets of ``native.tokenize(goal_template)``. Two empty sets have
  Jaccard 0. Of several similar crystals, the one named is the most similar
  (highest word overlap, then tool Jaccard, then oldest).
- **Effectiveness** starts at ``success_score``, which counts as the first
  observation; each ``RecordReuse`` adds one (1.0 for success, 0.0 for failure):
  ``effectiveness = (e * (n + 1) + outcome) / (n + 2)`` with ``n`` the reuse
  count before, i.e. ``(success_score + successes) / (1 + reuse_count)``.
- **Query** generalizes and tokenizes the goal and ranks crystals sharing at least
  one token by ``score = similarity * (0.5 + 0.5 * effectiveness)``, where
  ``similarity`` is the Jaccard of the token sets; ties go to the older crystal.
- **Eviction**: over ``max_crystals`` (default 200), the least effective crystal
  goes; ties: fewer reuses first, then the oldest. The crystal being created is
  never the one evicted.
- **IDs**: ``crystal_{session_id}_{milliseconds since the epoch}`` (the session ID
  cut to 96 characters so the ID stays within 128); if that ID is taken in the
  library (two crystals of one session in the same millisecond), ``-2``, ``-3``, ...
  is appended.

Novelty, query and eviction run in the native ``CrystalIndex`` (library.py
holds it); the constants they use are here.
"""

from __future__ import annotations

import base64
import binascii
import enum
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from stratad import crystal_format, native
from stratad.errors import InvalidArgumentError

DEFAULT_MAX_CRYSTALS = 200
#: The largest max_crystals a tenant may configure.
MAX_CRYSTALS_LIMIT = 10_000_000
DEFAULT_MIN_SUCCESS_SCORE = 0.7
#: Novelty: a crystal is redundant when an existing one is above both (strictly).
TOOL_SIMILARITY_THRESHOLD = 0.8
GOAL_SIMILARITY_THRESHOLD = 0.7
MAX_DECISIONS = 20
MAX_TOOLS = 15
MAX_ERROR_PATTERNS = 10
#: GetCrystalStats counts crystals at least this effective as effective.
EFFECTIVE_THRESHOLD = 0.5
DEFAULT_TOP_K = 3
MAX_TOP_K = crystal_format.MAX_TOP_K
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
#: stratad's bounds for what corteX leaves unbounded.
MAX_TEXT_CHARS = 8192
MAX_TRACE_STEPS = 10_000
_MAX_SESSION_IN_ID = 96
_TOKEN_RE = re.compile(r"c(0|[1-9][0-9]{0,18})")


# -- the crystal ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceStep:
    """One step of an execution trace (corteX's dict; "" is an absent key)."""

    decision: str = ""
    tool: str = ""
    error: str = ""
    resolution: str = ""


@dataclass(frozen=True, slots=True)
class ErrorPattern:
    error: str
    resolution: str = ""


@dataclass(frozen=True, slots=True)
class Crystal:
    crystal_id: str
    goal_template: str
    decision_chain: tuple[str, ...]
    tool_sequence: tuple[str, ...]
    error_patterns: tuple[ErrorPattern, ...]
    success_score: float
    reuse_count: int
    effectiveness: float
    entity_types: tuple[str, ...]
    created_from: str
    created_at: float


class Outcome(enum.Enum):
    CREATED = "created"
    BELOW_THRESHOLD = "below_threshold"
    NOT_NOVEL = "not_novel"


@dataclass(frozen=True, slots=True)
class CrystallizeResult:
    outcome: Outcome
    min_success_score: float
    crystal: Crystal | None = None
    #: NOT_NOVEL: the existing crystal and how similar it is.
    similar_crystal_id: str = ""
    goal_similarity: float = 0.0
    tool_similarity: float = 0.0
    #: CREATED: crystals evicted to make room, least effective first.
    evicted: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Match:
    crystal: Crystal
    similarity: float
    score: float


@dataclass(frozen=True, slots=True)
class LibraryConfig:
    max_crystals: int = DEFAULT_MAX_CRYSTALS
    min_success_score: float = DEFAULT_MIN_SUCCESS_SCORE


@dataclass(frozen=True, slots=True)
class Stats:
    total_crystals: int
    effective_crystals: int
    total_reuses: int
    avg_effectiveness: float
    max_crystals: int
    memory_bytes: int
    journal_bytes: int


# -- pure functions (corteX's logic) ----------------------------------------------


def _text(value: object, what: str, *, limit: int = MAX_TEXT_CHARS) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be a string")
    if len(value) > limit:
        raise InvalidArgumentError(f"{what} is longer than {limit} characters")
    return value


def _unit(value: object, what: str) -> float:
    """A float in [0, 1] (NaN and infinities refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{what} must be a number")
    number = float(value)
    if not (math.isfinite(number) and 0.0 <= number <= 1.0):
        raise InvalidArgumentError(f"{what} must be between 0 and 1, got {value!r}")
    return number + 0.0  # -0.0 -> 0.0


def validate_trace(trace: Sequence[TraceStep]) -> None:
    if len(trace) > MAX_TRACE_STEPS:
        raise InvalidArgumentError(f"execution_trace has more than {MAX_TRACE_STEPS} steps")
    for i, step in enumerate(trace):
        for name in ("decision", "tool", "error", "resolution"):
            _text(getattr(step, name), f"execution_trace[{i}].{name}")


def extract(
    goal: str,
    trace: Sequence[TraceStep],
    success_score: float,
    *,
    crystal_id: str,
    session_id: str,
    created_at: float,
) -> Crystal:
    """The crystal of one execution (inputs already validated)."""
    decisions = [s.decision for s in trace if s.decision][:MAX_DECISIONS]
    tools = list(dict.fromkeys(s.tool for s in trace if s.tool))[:MAX_TOOLS]
    errors = [ErrorPattern(s.error, s.resolution) for s in trace if s.error]
    return Crystal(
        crystal_id=crystal_id,
        goal_template=native.generalize_goal(goal),
        decision_chain=tuple(decisions),
        tool_sequence=tuple(tools),
        error_patterns=tuple(errors[:MAX_ERROR_PATTERNS]),
        success_score=success_score,
        reuse_count=0,
        effectiveness=success_score,
        entity_types=tuple(native.detect_entity_types(goal)),
        created_from=session_id,
        created_at=created_at,
    )


def running_average(effectiveness: float, reuse_count: int, success: bool) -> float:
    """Effectiveness after one more reuse (the original run counts as the first)."""
    value = (effectiveness * (reuse_count + 1) + (1.0 if success else 0.0)) / (reuse_count + 2)
    return min(1.0, max(0.0, value))


def format_prompt(crystal: Crystal) -> str:
    """corteX's ``apply`` output for ``crystal`` (the format: `stratad.crystal_format`)."""
    return crystal_format.format_prompt(
        goal_template=crystal.goal_template,
        decision_chain=crystal.decision_chain,
        tool_sequence=crystal.tool_sequence,
        error_patterns=((p.error, p.resolution) for p in crystal.error_patterns),
        effectiveness=crystal.effectiveness,
        reuse_count=crystal.reuse_count,
    )


def crystal_id_base(session_id: str, created_at: float) -> str:
    return f"crystal_{session_id[:_MAX_SESSION_IN_ID]}_{int(created_at * 1000)}"


def encode_page_token(seq: int) -> str:
    return base64.urlsafe_b64encode(f"c{seq}".encode()).decode()


def decode_page_token(token: str) -> int:
    """The sequence number a page token carries (-1 for none)."""
    if not token:
        return -1
    try:
        text = base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (ValueError, UnicodeDecodeError, binascii.Error):
        text = ""
    found = _TOKEN_RE.fullmatch(text)
    if found is None:
        raise InvalidArgumentError("page_token is not a token this server issued")
    return int(found.group(1))
