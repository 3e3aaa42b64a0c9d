"""Only `stratad/native.py` imports the extension module; it exports the contract."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "stratad"

# `import stratad._core`, `from stratad import _core`, `from stratad._core import x`,
# `from . import _core`, `from ._core import x`, importlib.import_module("..._core").
_IMPORTS_CORE = re.compile(
    r"^\s*(import\s+stratad\._core\b"
    r"|from\s+(stratad|\.)\s+import\s+(\([^)]*)?[^#\n]*\b_core\b"
    r"|from\s+(stratad)?\._core\s+import\b)"
    r"|import_module\(\s*[\"'][\w.]*_core[\"']",
    re.MULTILINE,
)

CONTRACT_NAMES = [
    "digest_hex", "Digester", "chunk_boundaries", "compress", "decompress", "encode_frame",
    "decode_frame", "verify_frame", "frame_digest_hex", "tokenize", "CrystalIndex",
    "generalize_goal", "detect_entity_types", "DEFAULT_MIN_CHUNK", "DEFAULT_AVG_CHUNK",
    "DEFAULT_MAX_CHUNK", "FRAME_HEADER_SIZE", "FORMAT_VERSION",
]  # fmt: skip

#: Deleted from the contract (no caller in stratad): they must stay gone.
REMOVED_NAMES = ["digest", "prepare_chunks", "PreparedChunk", "jaccard", "JaccardIndex", "top_k"]


def test_pattern_catches_the_import_forms() -> None:
    for line in (
        "import stratad._core",
        "from stratad import _core",
        "from stratad import errors, _core",
        "from stratad._core import digest",
        "from . import _core",
        "from ._core import *",
        "    from stratad._core import (digest,",
        'mod = importlib.import_module("stratad._core")',
    ):
        assert _IMPORTS_CORE.search(line), line
    for line in ("from stratad import native", "from stratad.native import digest", "# _core"):
        assert not _IMPORTS_CORE.search(line), line


def test_only_native_imports_core() -> None:
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "native.py" and _IMPORTS_CORE.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_native_exports_the_contract() -> None:
    native = pytest.importorskip("stratad.native")
    missing = [name for name in CONTRACT_NAMES if not hasattr(native, name)]
    assert missing == []
    assert [name for name in REMOVED_NAMES if hasattr(native, name)] == []
    assert native.FRAME_HEADER_SIZE == 52
    assert native.FORMAT_VERSION == 1
