"""How long the web inspector's API takes on a store of some size (docs/inspector.md).

Starts a real daemon with ``--inspector`` in a temporary data directory, fills
it through the SDK (``--sessions`` sessions; one session with ``--checkpoints``
checkpoints of a ~5 KB conversation; one with two ~1 MiB JSON states that
differ in 100 keys), then times ``--repeat`` GETs of each endpoint and prints
the median and the slowest. Prints only; it writes no document.

Usage: python bench/inspector.py [--sessions N] [--checkpoints N] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _daemon import daemon_process, free_port

import stratad

TENANT = "bench"


def fill(target: str, sessions: int, checkpoints: int) -> tuple[str, str]:
    """Returns the two checkpoint IDs of the big session."""
    with stratad.Client(target, tenant=TENANT) as client:
        for i in range(sessions):
            client.create_session(f"s-{i:06d}", labels={"team": f"t{i % 10}"})
        client.create_session("long")
        words = "the agent looked this up and wrote it down " * 2
        for step in range(checkpoints):
            window = [{"role": "user", "content": f"{step}-{n} {words}"} for n in range(50)]
            client.save_state("long", json.dumps({"step": step, "messages": window}).encode())
        client.create_session("big")
        a = {f"key-{k:05d}": "x" * 90 for k in range(10_000)}
        b = {**a, **{f"key-{k:05d}": "y" * 90 for k in range(0, 10_000, 100)}}
        first = client.save_state("big", json.dumps(a).encode()).checkpoint_id
        second = client.save_state("big", json.dumps(b).encode()).checkpoint_id
    return first, second


def timed(url: str, repeat: int) -> tuple[float, float, int]:
    """(median ms, max ms, response bytes) of ``repeat`` GETs."""
    times, size = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as response:
            size = len(response.read())
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    inspector = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory() as data_dir:
        extra = ("--inspector", inspector, "--durability", "none")
        with daemon_process(Path(data_dir), *extra) as (target, _):
            a, b = fill(target, args.sessions, args.checkpoints)
            base = f"http://{inspector}/api/tenants/{TENANT}/sessions"
            endpoints = {
                f"sessions list ({args.sessions + 2} sessions)": base,
                "sessions search (?q=t3)": f"{base}?q=t3",
                f"session page ({args.checkpoints} checkpoints)": f"{base}/long",
                "checkpoint state (1 MiB JSON)": f"{base}/big/checkpoints/{b}",
                "diff of two 1 MiB JSON states (100 changes)": f"{base}/big/diff?a={a}&b={b}",
            }
            print(f"| endpoint | median ms | max ms | answer bytes |  ({args.repeat} GETs each)")
            print("|---|---:|---:|---:|")
            for name, url in endpoints.items():
                median, slowest, size = timed(url, args.repeat)
                print(f"| {name} | {median:.1f} | {slowest:.1f} | {size:,} |")


if __name__ == "__main__":
    main()
