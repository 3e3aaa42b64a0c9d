"""bench/load.py --plot without matplotlib is refused before the run,
not after minutes of load when the report is drawn."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOAD = ROOT / "bench" / "load.py"


def run_load(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A matplotlib that cannot be imported, whether or not the real one is installed.
    shadow = tmp_path / "shadow"
    shadow.mkdir(exist_ok=True)
    (shadow / "matplotlib.py").write_text("raise ImportError('matplotlib is not installed')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAD_")}
    env["PYTHONPATH"] = os.pathsep.join([str(shadow), str(ROOT / "python")])
    return subprocess.run(
        [sys.executable, str(LOAD), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_plot_without_matplotlib_exits_2_before_any_load(tmp_path: Path) -> None:
    out = tmp_path / "out.png"
    started = time.monotonic()
    # Nothing listens on port 1: a run that started would fail later, with exit 1.
    result = run_load(tmp_path, "--address", "127.0.0.1:1", "--duration", "30", "--plot", str(out))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--plot needs matplotlib" in result.stderr
    assert "pip install matplotlib" in result.stderr
    assert result.stdout == ""  # no summary: no load was run
    assert not out.exists()
    assert time.monotonic() - started < 30  # refused at once, not after --duration
