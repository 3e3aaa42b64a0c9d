#!/usr/bin/env python3
"""Check deploy/Dockerfile without a Docker engine.

    check_dockerfile.py [--dockerfile deploy/Dockerfile] [--run --work DIR]

Static rules (always): a builder and a runtime stage; the runtime stage runs as
a numeric non-root user, declares the data directory a VOLUME, exposes the
gRPC and metrics ports, has a HEALTHCHECK that asks the gRPC health service
(``stratad ctl ... health``), starts ``stratad serve``; every COPY source
exists (a glob may match nothing); the builder and runtime RUN steps call
deploy/docker/build-wheel.sh and install-runtime.sh; the config file the
image ships is a valid stratad config.

With ``--run``, the image's build steps run here, outside Docker: build the
wheel with build-wheel.sh, check it with prebuilt-wheel.sh (the builder's
other path), install it with install-runtime.sh into a fresh prefix, start
the ENTRYPOINT + CMD from that prefix with the image's ENV and config file
(addresses moved to free loopback ports, data in a temp dir), run the
HEALTHCHECK command until it passes, scrape /metrics, check that nothing
under the install prefix was written (the image runs with a read-only root
filesystem), and stop the daemon with the STOPSIGNAL: it must exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRPC_PORT = "50051"
METRICS_PORT = "9464"
DATA_DIR = "/var/lib/stratad"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse(path: Path) -> list[Stage]:
    """Dockerfile instructions by stage (continuations joined, comments dropped)."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        args = args.strip()
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name, words[0]))
        elif stages:
            stages[-1].instructions.append((keyword, args))
    return stages


def exec_form(args: str) -> list[str]:
    """A JSON-array (exec form) argument list, or the shell form split."""
    if args.startswith("["):
        value = json.loads(args)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value)
        return value
    return ["/bin/sh", "-c", args]


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for args in stage.all("ENV"):
        for item in shlex.split(args):
            key, sep, value = item.partition("=")
            if sep:
                env[key] = value
    return env


def healthcheck_command(stage: Stage) -> list[str]:
    args = stage.last("HEALTHCHECK") or ""
    words = args.split()
    while words and words[0].startswith("--"):
        words.pop(0)
    if not words or words[0].upper() != "CMD":
        return []
    return exec_form(args[args.upper().index("CMD") + 3 :].strip())


class Problems(list[str]):
    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.append(message)


def static_checks(dockerfile: Path) -> Problems:
    problems = Problems()
    stages = parse(dockerfile)
    names = [s.name for s in stages]
    problems.check(len(stages) >= 2, "expected a multi-stage build (builder + runtime)")
    problems.check("builder" in names, "no stage named builder")
    if not stages:
        return problems
    runtime = stages[-1]
    builder = next((s for s in stages if s.name == "builder"), stages[0])
    # Running as a non-root user, by number (Kubernetes' runAsNonRoot needs a numeric UID).
    user = runtime.last("USER") or ""
    uid = user.split(":")[0]
    problems.check(
        uid.isdigit() and int(uid) != 0,
        f"runtime USER must be a numeric non-root UID, got {user!r}",
    )
    volumes = " ".join(runtime.all("VOLUME"))
    problems.check(DATA_DIR in volumes, f"the data directory {DATA_DIR} must be a VOLUME")
    exposed = " ".join(runtime.all("EXPOSE")).split()
    for port in (GRPC_PORT, METRICS_PORT):
        problems.check(port in exposed or f"{port}/tcp" in exposed, f"EXPOSE {port} is missing")
    health = healthcheck_command(runtime)
    problems.check(
        health[:2] == ["stratad", "ctl"] and health[-1] == "health",
        f"HEALTHCHECK must run `stratad ctl ... health` (the gRPC health service), got {health}",
    )
    entrypoint = exec_form(runtime.last("ENTRYPOINT") or "[]")
    cmd = exec_form(runtime.last("CMD") or "[]")
    problems.check(entrypoint == ["stratad"], f'ENTRYPOINT must be ["stratad"], got {entrypoint}')
    problems.check(cmd[:1] == ["serve"], f"CMD must start with serve, got {cmd}")
    problems.check(
        any("deploy/docker/build-wheel.sh" in r for r in builder.all("RUN")),
        "the builder stage must build with deploy/docker/build-wheel.sh (CI runs it too)",
    )
    problems.check(
        any("install-runtime.sh" in r for r in runtime.all("RUN")),
        "the runtime stage must install with install-runtime.sh (CI runs it too)",
    )
    for stage in stages:
        for args in stage.all("COPY"):
            words = [w for w in args.split() if not w.startswith("--")]
            if any(w.startswith("--from") for w in args.split()):
                continue
            for source in words[:-1]:
                if any(c in source for c in "*?["):
                    continue  # a glob may match nothing (dist*/: deploy/docker/prebuilt/README.md)
                problems.check((ROOT / source).exists(), f"COPY source {source} does not exist")
    env = env_of(runtime)
    config = env.get("STRATAD_CONFIG", "")
    problems.check(bool(config), "the runtime stage must set STRATAD_CONFIG")
    shipped = _shipped_file(runtime, config)
    problems.check(shipped is not None, f"no COPY puts a file at {config}")
    if shipped is not None:
        sys.path.insert(0, str(ROOT / "python"))
        from stratad.config import ConfigError, load_config

        try:
            loaded = load_config(config_file=ROOT / shipped)
        except ConfigError as exc:
            problems.append(f"{shipped}: {exc.message}")
        else:
            problems.check(
                loaded.listen.endswith(":" + GRPC_PORT) and loaded.listen.startswith("0.0.0.0"),
                f"{shipped}: listen must be 0.0.0.0:{GRPC_PORT} (probes dial the pod IP)",
            )
            problems.check(
                str(loaded.data_dir) == DATA_DIR, f"{shipped}: data_dir must be {DATA_DIR}"
            )
            problems.check(
                loaded.metrics_listen.endswith(":" + METRICS_PORT),
                f"{shipped}: metrics_listen must use port {METRICS_PORT}",
            )
    return problems


def _shipped_file(stage: Stage, destination: str) -> str | None:
    for args in stage.all("COPY"):
        words = [w for w in args.split() if not w.startswith("--")]
        if len(words) == 2 and words[1] == destination:
            return words[0]
    return None


# --- running the build steps outside Docker ------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


def run_build(dockerfile: Path, work: Path) -> None:
    runtime = parse(dockerfile)[-1]
    dist = work / "dist"
    prefix = work / "opt-stratad"
    shutil.rmtree(dist, ignore_errors=True)
    shutil.rmtree(work / "dist-prebuilt", ignore_errors=True)
    shutil.rmtree(prefix, ignore_errors=True)
    env = {**os.environ, "BUILD_VENV": str(work / "build-venv")}
    step("builder: deploy/docker/build-wheel.sh")
    subprocess.run(
        [str(ROOT / "deploy/docker/build-wheel.sh"), str(dist)], cwd=ROOT, env=env, check=True
    )
    # The other path of the builder stage (STRATAD_WHEEL=<file>, what make
    # image uses): the wheel just built must pass the check against this checkout.
    step("builder, prebuilt wheel: deploy/docker/prebuilt-wheel.sh")
    (built,) = dist.glob("stratad-*.whl")
    subprocess.run(
        [str(ROOT / "deploy/docker/prebuilt-wheel.sh"), str(built), str(work / "dist-prebuilt")],
        cwd=ROOT,
        check=True,
    )
    step("runtime: deploy/docker/install-runtime.sh")
    subprocess.run(
        [str(ROOT / "deploy/docker/install-runtime.sh"), str(dist), str(prefix)],
        cwd=ROOT,
        check=True,
    )

    step("runtime: ENTRYPOINT + CMD with the image's ENV, HEALTHCHECK, metrics, SIGTERM")
    image_env = env_of(runtime)
    grpc_port, metrics_port = free_port(), free_port()
    data = Path(tempfile.mkdtemp(prefix="stratad-image-data-"))
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAD_")}
    for key, value in image_env.items():
        value = value.replace("/opt/stratad", str(prefix)).replace("$PATH", os.environ["PATH"])
        run_env[key] = value
    shipped = _shipped_file(runtime, image_env["STRATAD_CONFIG"])
    assert shipped is not None
    # The image's config file, with the addresses moved to free loopback ports
    # (environment beats the file) and the data directory to a temp dir.
    run_env.update(
        STRATAD_CONFIG=str(ROOT / shipped),
        STRATAD_LISTEN=f"127.0.0.1:{grpc_port}",
        STRATAD_METRICS_LISTEN=f"127.0.0.1:{metrics_port}",
        STRATAD_DATA_DIR=str(data),
    )
    command = exec_form(runtime.last("ENTRYPOINT") or "[]") + exec_form(runtime.last("CMD") or "[]")
    before = tree_state(prefix)
    log = (work / "daemon.log").open("wb")
    proc = subprocess.Popen(command, env=run_env, cwd=data, stdout=log, stderr=subprocess.STDOUT)
    try:
        health = [
            w.replace(f"127.0.0.1:{GRPC_PORT}", f"127.0.0.1:{grpc_port}")
            for w in healthcheck_command(runtime)
        ]
        deadline = time.monotonic() + 60
        while True:
            result = subprocess.run(
                health, env=run_env, capture_output=True, text=True, check=False
            )
            if result.returncode == 0:
                print(f"  HEALTHCHECK {' '.join(health)}: {result.stdout.strip()}")
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"HEALTHCHECK never passed:\n{(work / 'daemon.log').read_text()}")
            time.sleep(0.5)
        save = [str(prefix / "bin/python"), "-c", _SMOKE, f"127.0.0.1:{grpc_port}"]
        subprocess.run(save, env=run_env, check=True)
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        if "stratad_build_info" not in text or "grpc_server_handled_total" not in text:
            raise SystemExit(f"{url} lacks stratad's metrics")
        print(f"  {url}: {len(text.splitlines())} lines")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        if code != 0:
            raise SystemExit(
                f"the daemon exited {code} after SIGTERM:\n{(work / 'daemon.log').read_text()}"
            )
        print("  SIGTERM: exited 0")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(data, ignore_errors=True)
    written = {k for k, v in tree_state(prefix).items() if before.get(k) != v}
    if written:
        raise SystemExit(
            f"the daemon wrote under its install prefix (read-only in the image): "
            f"{sorted(written)[:5]}"
        )
    print("  nothing written under the install prefix (read-only root filesystem)")


_SMOKE = """
import sys, stratad
with stratad.Client(sys.argv[1]) as c:
    c.create_session("image-smoke")
    saved = c.save_state("image-smoke", b"hello" * 1000)
    assert c.load_state("image-smoke").digest == saved.digest
print("  saved and loaded a state through the installed SDK")
"""


def step(message: str) -> None:
    print(f"--- {message}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dockerfile", type=Path, default=ROOT / "deploy/Dockerfile")
    parser.add_argument("--run", action="store_true", help="also run the build steps here")
    parser.add_argument("--work", type=Path, default=ROOT / ".tools/docker", help="scratch dir")
    args = parser.parse_args()
    problems = static_checks(args.dockerfile)
    for problem in problems:
        print(f"{args.dockerfile}: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"{args.dockerfile}: static checks passed")
    if args.run:
        args.work.mkdir(parents=True, exist_ok=True)
        run_build(args.dockerfile, args.work.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
