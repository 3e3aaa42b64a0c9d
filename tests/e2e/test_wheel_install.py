"""The wheel installs and works where there is no Rust (docs/install.md), as
an agent's SDK without the daemon's dependencies, and as the daemon with them.

`make wheel` (scripts/build-wheel.sh) builds stratad's wheel into dist/. This
test installs it into two fresh virtualenvs made by the system Python 3.11, in
an environment whose PATH has no cargo or rustc, with ``--only-binary :all:``
so that pip can build nothing from source (not stratad, not a dependency):

- the agent's: the plain wheel (``pip install stratad``: the SDK, ctl, the
  adapters), which must not bring the daemon's dependencies (obstore,
  cryptography, prometheus-client, orjson, grpcio-reflection: the ``server``
  extra), then the ``langgraph`` extra on top;
- the daemon's: the wheel with the ``server`` extra (as the image installs it,
  deploy/docker/install-runtime.sh).

Then, from those virtualenvs only (no PYTHONPATH, run outside the checkout):
``stratad --version`` in both; ``stratad serve`` (and ``keygen``) in the
agent's exiting 2 with one line naming the extra; ``stratad serve`` from the
daemon's on a free port with a fresh data directory; and from the agent's,
``stratad ctl health``, the SDK saving and loading a state (a large one too,
chunked by the Rust core) and a LangGraph StateGraph with StratadSaver that
stops after its first step in one process and finishes its second step in
another.

The wheel is $STRATAD_WHEEL if set (`make wheel-test` and CI pass the one
`make wheel` just built); otherwise this test runs scripts/build-wheel.sh
itself (seconds after `make dev`: it reuses ./target).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_WHEEL = ROOT / "scripts" / "build-wheel.sh"
WHEEL_NAME = re.compile(
    r"^stratad-(?P<version>[^-]+)-cp311-abi3-"
    r"(?P<platform>manylinux_2_\d+_x86_64|manylinux2014_x86_64\.manylinux_2_17_x86_64)\.whl$"
)


@pytest.fixture(scope="module")
def wheel() -> Path:
    given = os.environ.get("STRATAD_WHEEL")
    if given:
        path = Path(given).resolve()
        assert path.is_file(), f"STRATAD_WHEEL={given} is not a file"
        return path
    # A cold Rust release build takes minutes; after `make dev` this is seconds.
    built = subprocess.run(
        ["bash", str(BUILD_WHEEL)], capture_output=True, text=True, timeout=1200, check=False
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return Path(built.stdout.strip().splitlines()[-1])


def cargo_free_env(venv: Path) -> dict[str, str]:
    """This environment minus Rust (cargo, rustc, rustup) and anything pointing
    into the checkout or another virtualenv; the new venv's bin first on PATH."""
    rust = ("cargo", "rustc", "rustup")
    path = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not any(os.access(Path(d) / tool, os.X_OK) for tool in rust)
    ]
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CARGO_HOME", "RUSTUP_HOME")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in dropped and not k.startswith(("STRATAD_", "CARGO_", "RUSTC", "MATURIN"))
    }
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["STRATAD_METRICS_LISTEN"] = "off"  # no fixed port: tests run side by side
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def base_python() -> str:
    """The system Python 3.11 (not the dev venv's): a user's fresh venv starts there."""
    found = shutil.which("python3.11")
    return found or str(getattr(sys, "_base_executable", sys.executable))


#: What the ``server`` extra brings (top-level modules): an agent's plain
#: install must not have them. stratad.cli.DAEMON_MODULES must be this list.
DAEMON_MODULES = ("obstore", "cryptography", "prometheus_client", "orjson", "grpc_reflection")
SERVER_HINT = "stratad serve needs the daemon's dependencies: pip install 'stratad[server]'"

# Which of DAEMON_MODULES a venv can import (run with that venv's python).
PROBE = """
import importlib.util, json, sys
print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None]))
"""


class WheelVenv:
    def __init__(self, root: Path, env: dict[str, str], pip_output: str) -> None:
        self.root = root
        self.env = env
        self.pip_output = pip_output
        # The agent's venv: what installing the plain wheel gave, before an extra.
        self.plain_output = ""
        self.plain_importable: list[str] = []

    @property
    def python(self) -> str:
        return str(self.root / "venv" / "bin" / "python")

    @property
    def stratad(self) -> str:
        return str(self.root / "venv" / "bin" / "stratad")

    def run(self, *cmd: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in the cargo-free environment, from a directory outside the checkout."""
        return subprocess.run(
            list(cmd),
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def pip_install(self, requirement: str) -> str:
        # --only-binary :all: : pip may not build anything, stratad or a dependency.
        pip = self.run(
            str(self.root / "venv" / "bin" / "pip"), "install", "--only-binary", ":all:",
            requirement, timeout=600,
        )  # fmt: skip
        assert pip.returncode == 0, pip.stdout + pip.stderr
        return pip.stdout + pip.stderr

    def importable(self, *modules: str) -> list[str]:
        found = self.run(self.python, "-c", PROBE, *modules)
        assert found.returncode == 0, found.stderr
        return list(json.loads(found.stdout))

    def script(self, name: str, code: str, *args: str) -> subprocess.CompletedProcess[str]:
        path = self.root / name
        path.write_text(textwrap.dedent(code))
        return self.run(self.python, str(path), *args)


def make_venv(root: Path) -> WheelVenv:
    venv = root / "venv"
    env = cargo_free_env(venv)
    made = subprocess.run(
        [base_python(), "-m", "venv", str(venv)], env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return WheelVenv(root, env, "")


@pytest.fixture(scope="module")
def wheel_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> WheelVenv:
    """The agent's: the plain wheel (`pip install stratad`), then [langgraph].
    ``plain_output`` and ``plain_importable`` are what the plain install gave."""
    agent = make_venv(tmp_path_factory.mktemp("wheel-install"))
    agent.plain_output = agent.pip_install(str(wheel))
    # Before the extra: a framework's own dependencies may bring some of these
    # (langgraph-sdk and langsmith require orjson); stratad's must not.
    agent.plain_importable = agent.importable(*DAEMON_MODULES)
    agent.pip_output = agent.pip_install(f"{wheel}[langgraph]")
    return agent


@pytest.fixture(scope="module")
def server_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> WheelVenv:
    """The daemon's: the wheel with the server extra, as the image installs it."""
    daemon = make_venv(tmp_path_factory.mktemp("wheel-install-server"))
    daemon.pip_output = daemon.pip_install(f"{wheel}[server]")
    return daemon


def test_the_wheel_is_abi3_manylinux_and_carries_the_extension(wheel: Path) -> None:
    match = WHEEL_NAME.match(wheel.name)
    assert match, f"{wheel.name}: not a cp311-abi3 manylinux x86_64 wheel"
    names = zipfile.ZipFile(wheel).namelist()
    assert "stratad/_core.abi3.so" in names, names
    assert "stratad/cli.py" in names
    assert any(n.endswith(".dist-info/entry_points.txt") for n in names)


def test_installs_without_rust_and_without_building(
    wheel: Path, wheel_venv: WheelVenv, server_venv: WheelVenv
) -> None:
    for venv, output in (
        (wheel_venv, wheel_venv.plain_output),
        (wheel_venv, wheel_venv.pip_output),
        (server_venv, server_venv.pip_output),
    ):
        # No Rust where the wheel was installed.
        assert shutil.which("cargo", path=venv.env["PATH"]) is None
        assert shutil.which("rustc", path=venv.env["PATH"]) is None
        probe = venv.run("bash", "-c", "command -v cargo || command -v rustc")
        assert probe.returncode != 0, probe.stdout
        # pip took stratad from the wheel file and built nothing.
        assert f"Processing {wheel}" in output or f"Processing ./{wheel.name}" in output, output
        assert "Building wheel" not in output, output
        assert "Preparing metadata (pyproject.toml)" not in output, output
    for output in (wheel_venv.plain_output, server_venv.pip_output):
        assert re.search(r"Successfully installed .*\bstratad-\S+", output), output
    # The package and its Rust core come from the venv, not the checkout.
    for venv, imports in ((wheel_venv, "langgraph"), (server_venv, "stratad.server.app")):
        where = venv.run(
            venv.python, "-c",
            f"import stratad, stratad._core, {imports}; print(stratad.__file__); "
            "print(stratad._core.__file__)",
        )  # fmt: skip
        assert where.returncode == 0, where.stderr
        site = str(venv.root / "venv" / "lib")
        package, core = where.stdout.split()
        assert package.startswith(site) and core.startswith(site), where.stdout
        assert core.endswith("_core.abi3.so")


def test_the_plain_wheel_brings_no_daemon_dependency(wheel_venv: WheelVenv) -> None:
    """`pip install stratad` is an agent's: grpcio, protobuf, grpcio-status,
    grpcio-health-checking; not the server extra's packages."""
    assert wheel_venv.plain_importable == [], wheel_venv.plain_output
    installed = re.search(r"Successfully installed (.*)", wheel_venv.plain_output)
    assert installed, wheel_venv.plain_output
    names = {re.sub(r"-[^-]+$", "", n).lower() for n in installed[1].split()}
    assert names.isdisjoint(
        {"obstore", "cryptography", "cffi", "prometheus-client", "prometheus_client", "orjson",
         "grpcio-reflection", "grpcio_reflection"}
    ), names  # fmt: skip


def test_the_server_extra_is_what_the_cli_asks_for(server_venv: WheelVenv) -> None:
    """The top-level modules of the server extra's packages, read from the
    installed metadata, are the ones stratad.cli names (and this test checks)."""
    found = server_venv.script(
        "server_extra.py",
        """
        import importlib.metadata as md
        import json
        import re

        from stratad.cli import DAEMON_MODULES

        extra = [
            re.match(r"[A-Za-z0-9_.-]+", r)[0]
            for r in md.requires("stratad") or []
            if 'extra=="server"' in r.replace("'", '"').replace(" ", "")
        ]
        tops = set()
        for name in extra:
            for path in md.distribution(name).files or []:
                top = path.parts[0]
                if top == ".." or top.endswith((".dist-info", ".data", ".libs", ".pth")):
                    continue
                tops.add(top.removesuffix(".py"))
        print(json.dumps({"cli": sorted(DAEMON_MODULES), "extra": sorted(tops)}))
        """,
    )
    assert found.returncode == 0, found.stderr
    modules = json.loads(found.stdout)
    assert modules["extra"] == modules["cli"] == sorted(DAEMON_MODULES), modules
    assert server_venv.importable(*DAEMON_MODULES) == list(DAEMON_MODULES)


def test_cli_version(wheel: Path, wheel_venv: WheelVenv, server_venv: WheelVenv) -> None:
    version = WHEEL_NAME.match(wheel.name)
    assert version
    for venv in (wheel_venv, server_venv):
        out = venv.run(venv.stratad, "--version")
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"stratad {version['version']}"


def test_serve_without_the_server_extra_says_which_extra(
    wheel_venv: WheelVenv, tmp_path: Path
) -> None:
    """One line naming the extra and the missing module, exit 2: no traceback."""
    data = tmp_path / "data"
    commands = {
        "serve": ["serve", "--listen", "127.0.0.1:0", "--data-dir", str(data)],
        "keygen": ["keygen"],
        "rotate-key": ["rotate-key", "--data-dir", str(data), "--encryption-old-key-files", "k"],
    }
    for command, argv in commands.items():
        out = wheel_venv.run(wheel_venv.stratad, *argv)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stdout == "", out.stdout
        lines = out.stderr.splitlines()
        assert len(lines) == 1, out.stderr
        hint = SERVER_HINT.replace("stratad serve", f"stratad {command}")
        assert re.fullmatch(
            re.escape(hint) + r" \(no module named '(" + "|".join(DAEMON_MODULES) + r")'\)",
            lines[0],
        ), lines[0]
    assert not data.exists()  # nothing was started, nothing was written


SDK = """
    import os
    import sys

    import stratad

    with stratad.Client(sys.argv[1]) as client:
        client.create_session("wheel-1", exist_ok=True)
        saved = client.save_state("wheel-1", b'{"step": 1}', content_type="application/json")
        loaded = client.load_state("wheel-1")
        assert loaded.data == b'{"step": 1}', loaded.data
        assert loaded.checkpoint_id == saved.checkpoint_id
        assert loaded.digest == saved.digest
        # Large states are cut, hashed and framed client-side by the Rust core
        # (sdk/upload.py), which the plain wheel carries.
        big = os.urandom(1 << 20)
        client.save_state("wheel-1", big)
        edited = big[:700_000] + b"edited" + big[700_000:]
        again = client.save_state("wheel-1", edited)
        loaded = client.load_state("wheel-1")
        assert loaded.data == edited and loaded.digest == again.digest
        print("sdk ok", saved.checkpoint_id)
"""

GRAPH = """
    import sys
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    from stratad.integrations.langgraph import StratadSaver


    class State(TypedDict):
        steps: list[str]


    def first(state: State) -> dict:
        print("ran first", flush=True)
        return {"steps": [*state["steps"], "first"]}


    def second(state: State) -> dict:
        print("ran second", flush=True)
        return {"steps": [*state["steps"], "second"]}


    graph = StateGraph(State)
    graph.add_node("first", first)
    graph.add_node("second", second)
    graph.add_edge(START, "first")
    graph.add_edge("first", "second")
    graph.add_edge("second", END)

    address, phase = sys.argv[1], sys.argv[2]
    config = {"configurable": {"thread_id": "wheel-thread"}}
    with StratadSaver(address) as saver:
        # Stop before "second": the process ends with one step done and checkpointed.
        app = graph.compile(checkpointer=saver, interrupt_before=["second"])
        if phase == "start":
            out = app.invoke({"steps": []}, config)
        else:  # a new process: the sidecar's last checkpoint resumes the thread
            print("next", list(app.get_state(config).next), flush=True)
            out = app.invoke(None, config)
        print("steps", ",".join(out["steps"]), flush=True)
"""


def test_serve_sdk_and_langgraph_from_the_wheel(
    wheel_venv: WheelVenv,
    server_venv: WheelVenv,
    tmp_path: Path,
    get_free_port: Callable[[], int],
    wait_serving: Callable[..., None],
) -> None:
    """The daemon from the [server] venv; the agent's side from the plain one."""
    target = f"127.0.0.1:{get_free_port()}"
    log_path = tmp_path / "daemon.log"
    cmd = [server_venv.stratad, "serve", "--listen", target, "--data-dir", str(tmp_path / "data")]
    with log_path.open("wb") as log:
        daemon = subprocess.Popen(
            cmd, env=server_venv.env, cwd=server_venv.root, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        try:
            wait_serving(target, timeout=30.0, proc=daemon)
        except BaseException:
            print(log_path.read_text(errors="replace"), file=sys.stderr)
            raise
        for venv in (wheel_venv, server_venv):
            health = venv.run(venv.stratad, "ctl", "--address", target, "health")
            assert health.returncode == 0, health.stdout + health.stderr

        sdk = wheel_venv.script("sdk.py", SDK, target)
        assert sdk.returncode == 0, sdk.stdout + sdk.stderr
        assert sdk.stdout.startswith("sdk ok "), sdk.stdout

        start = wheel_venv.script("graph.py", GRAPH, target, "start")
        assert start.returncode == 0, start.stdout + start.stderr
        assert start.stdout.splitlines() == ["ran first", "steps first"], start.stdout

        resume = wheel_venv.script("graph.py", GRAPH, target, "resume")
        assert resume.returncode == 0, resume.stdout + resume.stderr
        # The second process starts at "second" (first is not run again).
        assert resume.stdout.splitlines() == [
            "next ['second']",
            "ran second",
            "steps first,second",
        ], resume.stdout

        daemon.terminate()
        assert daemon.wait(timeout=30) == 0, log_path.read_text(errors="replace")
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=30)
