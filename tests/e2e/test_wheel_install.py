"""The wheel installs and works where there is no Rust (docs/install.md).

`make wheel` (scripts/build-wheel.sh) builds stratad's wheel into dist/. This
test installs it, with the ``langgraph`` extra, into a fresh virtualenv made
by the system Python 3.11, in an environment whose PATH has no cargo or rustc,
with ``--only-binary :all:`` so that pip can build nothing from source (not
stratad, not a dependency). Then, from that virtualenv only (no PYTHONPATH,
run outside the checkout): ``stratad --version``; ``stratad serve`` on a free
port with a fresh data directory; the SDK saving and loading a state; and a
LangGraph StateGraph with StratadSaver that stops after its first step in one
process and finishes its second step in another.

The wheel is $STRATAD_WHEEL if set (`make wheel-test` and CI pass the one
`make wheel` just built); otherwise this test runs scripts/build-wheel.sh
itself (seconds after `make dev`: it reuses ./target).
"""

from __future__ import annotations

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


class WheelVenv:
    def __init__(self, root: Path, env: dict[str, str], pip_output: str) -> None:
        self.root = root
        self.env = env
        self.pip_output = pip_output

    @property
    def python(self) -> str:
        return str(self.root / "venv" / "bin" / "python")

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

    def script(self, name: str, code: str, *args: str) -> subprocess.CompletedProcess[str]:
        path = self.root / name
        path.write_text(textwrap.dedent(code))
        return self.run(self.python, str(path), *args)


@pytest.fixture(scope="module")
def wheel_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> WheelVenv:
    root = tmp_path_factory.mktemp("wheel-install")
    venv = root / "venv"
    env = cargo_free_env(venv)
    made = subprocess.run(
        [base_python(), "-m", "venv", str(venv)], env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    # --only-binary :all: : pip may not build anything, stratad or a dependency.
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--only-binary", ":all:", f"{wheel}[langgraph]"],
        env=env, cwd=root, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return WheelVenv(root, env, pip.stdout + pip.stderr)


def test_the_wheel_is_abi3_manylinux_and_carries_the_extension(wheel: Path) -> None:
    match = WHEEL_NAME.match(wheel.name)
    assert match, f"{wheel.name}: not a cp311-abi3 manylinux x86_64 wheel"
    names = zipfile.ZipFile(wheel).namelist()
    assert "stratad/_core.abi3.so" in names, names
    assert "stratad/cli.py" in names
    assert any(n.endswith(".dist-info/entry_points.txt") for n in names)


def test_installs_without_rust_and_without_building(wheel: Path, wheel_venv: WheelVenv) -> None:
    # No Rust where the wheel was installed.
    assert shutil.which("cargo", path=wheel_venv.env["PATH"]) is None
    assert shutil.which("rustc", path=wheel_venv.env["PATH"]) is None
    probe = wheel_venv.run("bash", "-c", "command -v cargo || command -v rustc")
    assert probe.returncode != 0, probe.stdout
    # pip took stratad from the wheel file and built nothing.
    out = wheel_venv.pip_output
    assert f"Processing {wheel}" in out or f"Processing ./{wheel.name}" in out, out
    assert "Building wheel" not in out and "Preparing metadata (pyproject.toml)" not in out, out
    assert re.search(r"Successfully installed .*\bstratad-\S+", out), out
    # The package and its Rust core come from the venv, not the checkout.
    where = wheel_venv.run(
        wheel_venv.python, "-c",
        "import stratad, stratad._core, langgraph; print(stratad.__file__); "
        "print(stratad._core.__file__)",
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    site = str(wheel_venv.root / "venv" / "lib")
    package, core = where.stdout.split()
    assert package.startswith(site) and core.startswith(site), where.stdout
    assert core.endswith("_core.abi3.so")


def test_cli_version(wheel: Path, wheel_venv: WheelVenv) -> None:
    version = WHEEL_NAME.match(wheel.name)
    assert version
    out = wheel_venv.run(str(wheel_venv.root / "venv" / "bin" / "stratad"), "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"stratad {version['version']}"


SDK = """
    import sys

    import stratad

    with stratad.Client(sys.argv[1]) as client:
        client.create_session("wheel-1", exist_ok=True)
        saved = client.save_state("wheel-1", b'{"step": 1}', content_type="application/json")
        loaded = client.load_state("wheel-1")
        assert loaded.data == b'{"step": 1}', loaded.data
        assert loaded.checkpoint_id == saved.checkpoint_id
        assert loaded.digest == saved.digest
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
    tmp_path: Path,
    get_free_port: Callable[[], int],
    wait_serving: Callable[..., None],
) -> None:
    target = f"127.0.0.1:{get_free_port()}"
    log_path = tmp_path / "daemon.log"
    stratad = str(wheel_venv.root / "venv" / "bin" / "stratad")
    cmd = [stratad, "serve", "--listen", target, "--data-dir", str(tmp_path / "data")]
    with log_path.open("wb") as log:
        daemon = subprocess.Popen(
            cmd, env=wheel_venv.env, cwd=wheel_venv.root, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        try:
            wait_serving(target, timeout=30.0, proc=daemon)
        except BaseException:
            print(log_path.read_text(errors="replace"), file=sys.stderr)
            raise
        health = wheel_venv.run(stratad, "ctl", "--address", target, "health")
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
