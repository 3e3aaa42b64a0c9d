"""corteX's cognitive state and memory on stratad (seeds 000 and 001).

``from stratad.compat.cortex import StateFileManager`` replaces
``from corteX.engine.cognitive.state_files import StateFileManager``; see
`stratad.compat.cortex_state` for how the three layers live in the daemon.
"""

from stratad.compat.cortex_state import (
    CrystallizedState,
    FluidState,
    InsightState,
    StateFileManager,
)

__all__ = ["CrystallizedState", "FluidState", "InsightState", "StateFileManager"]
