"""Crystal memory: reusable patterns extracted from successful runs, one library
per tenant (corteX's ``MemoryCrystallizer``). User guide: docs/crystals.md.

The package, by concern, each module importing only those above it:

- ``model``: the crystal's types, limits, input validation and extraction rules;
- ``codec``: how its journal records are encoded and read back;
- ``library``: one tenant's library in memory (columns over the native index);
- ``merge``: how a record changes a library, whoever wrote it (replication);
- ``persistence``: the journals: appends, replay at start, compaction;
- ``service``: ``CrystalLibraries``, the operations CrystalService calls.

Import from here. Names with a leading underscore are private to the package
(shared between its modules, not part of its interface).
"""

# bench/crystals.py writes a large journal directly, with the record bodies the service writes.
from stratad.domain.crystals.codec import _crystal_body as _crystal_body
from stratad.domain.crystals.model import (
    DEFAULT_MAX_CRYSTALS,
    DEFAULT_MIN_SUCCESS_SCORE,
    GOAL_SIMILARITY_THRESHOLD,
    MAX_CRYSTALS_LIMIT,
    MAX_TOP_K,
    TOOL_SIMILARITY_THRESHOLD,
    Crystal,
    CrystallizeResult,
    ErrorPattern,
    LibraryConfig,
    Match,
    Outcome,
    Stats,
    TraceStep,
    crystal_id_base,
    decode_page_token,
    encode_page_token,
    extract,
    format_prompt,
    running_average,
)
from stratad.domain.crystals.persistence import DIRECTORY, JOURNAL
from stratad.domain.crystals.service import CrystalLibraries

__all__ = [
    "DEFAULT_MAX_CRYSTALS",
    "DEFAULT_MIN_SUCCESS_SCORE",
    "DIRECTORY",
    "GOAL_SIMILARITY_THRESHOLD",
    "JOURNAL",
    "MAX_CRYSTALS_LIMIT",
    "MAX_TOP_K",
    "TOOL_SIMILARITY_THRESHOLD",
    "Crystal",
    "CrystalLibraries",
    "CrystallizeResult",
    "ErrorPattern",
    "LibraryConfig",
    "Match",
    "Outcome",
    "Stats",
    "TraceStep",
    "crystal_id_base",
    "decode_page_token",
    "encode_page_token",
    "extract",
    "format_prompt",
    "running_average",
]
