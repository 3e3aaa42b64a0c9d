"""The Go toolchain the Go-built test tools need (the Go client, grpc-go's
interop client, h2spec): its path, or the test skips, or fails where
STRATAD_REQUIRE_GO is set (CI), so a missing toolchain cannot hide there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def find_go() -> str:
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
    if go is None:
        reason = "no Go toolchain (go on PATH or /usr/local/go/bin/go)"
        if os.environ.get("STRATAD_REQUIRE_GO", "") not in ("", "0"):
            pytest.fail(f"STRATAD_REQUIRE_GO is set but there is {reason}", pytrace=False)
        pytest.skip(reason)
    return go
