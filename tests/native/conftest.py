"""Make `stratad` importable from a source tree that was never installed.

`stratad.errors` is pure Python and the reference needs it even before the
Rust extension is built; once `maturin develop` has installed the package
this does nothing. Tests of the native module skip themselves (through
`pytest.importorskip`) while `stratad.native` cannot be imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import stratad  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
