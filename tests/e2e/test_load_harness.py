"""bench/load.py end to end: it spawns a daemon, drives it, and reports in JSON.

No timing assertions (docs/design.md: benchmarks never assert timings): a
shared machine may be slow, but every request must complete without error and
the report must carry the keys docs/load-testing.md documents.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LOAD = Path(__file__).resolve().parents[2] / "bench" / "load.py"
TOP_KEYS = {
    "config", "finished_at", "elapsed_s", "requests", "throughput_per_s", "latency_ms",
    "histogram", "errors_by_code", "windows", "rss", "interrupted", "cpu_pct_of_one_core", "host",
}  # fmt: skip
REQUEST_KEYS = {"scheduled", "sent", "completed", "errors", "dropped", "late", "max_send_lag_ms"}
LATENCY_KEYS = {"p50", "p90", "p99", "p99.9", "max", "mean"}


def test_spawned_open_loop_run_reports_json(tmp_path: Path, stratad_env: dict[str, str]) -> None:
    out = tmp_path / "load.json"
    args = ["--spawn", "--duration", "3", "--rate", "50", "--json", str(out)]
    result = subprocess.run(
        [sys.executable, str(LOAD), *args],
        env=stratad_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr

    report = json.loads(out.read_text())
    assert report.keys() >= TOP_KEYS
    assert report["requests"].keys() >= REQUEST_KEYS
    assert report["latency_ms"].keys() >= LATENCY_KEYS
    assert report["interrupted"] is False
    assert report["requests"]["completed"] > 0
    assert report["requests"]["errors"] == 0
    assert report["errors_by_code"] == {}
    assert sum(b["count"] for b in report["histogram"]) == report["requests"]["completed"]
    assert sum(w["completed"] for w in report["windows"]) == report["requests"]["completed"]
    # The harness spawned the daemon, so it sampled the daemon's RSS.
    assert report["rss"]["samples"]
    assert report["rss"]["start_bytes"] > 0
