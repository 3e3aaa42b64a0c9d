"""Node.js for the TypeScript packages' tests (clients/ts, clients/langgraph-js): present, or
the test skips, or fails where STRATAD_REQUIRE_NODE is set (CI), so a missing toolchain cannot
hide there; `install` runs a package's dependency script (npm ci when stale)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def require_node() -> None:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        message = f"{' and '.join(missing)} not installed (Node.js >= 20 is needed)"
        if os.environ.get("STRATAD_REQUIRE_NODE"):
            pytest.fail(message + "; STRATAD_REQUIRE_NODE is set")
        pytest.skip(message)


def install(deps_script: Path, timeout: float = 600) -> None:
    """Node present, then ``deps_script`` (npm ci when the lock changed, build) succeeded."""
    require_node()
    result = subprocess.run(
        [str(deps_script)], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def node_env(**extra: str) -> dict[str, str]:
    """The caller's environment without STRATAD_* (no stray daemon settings), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAD_")}
    return {**env, **extra}
