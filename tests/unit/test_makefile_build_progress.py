"""`make run` / `make dev` show the Rust build's progress.

The Makefile's $(STAMP) rule installs stratad with pip, which builds the Rust
core; pip hides a build's output unless --verbose, so a quiet install printed
nothing for minutes. These tests run the rule itself, with make, against a
stand-in project whose PEP 517 backend prints cargo-like lines slowly: no Rust
is built and no index is reached (PIP_NO_INDEX).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = ROOT / "Makefile"
PROGRESS_LINE = "building the Rust core"

pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or shutil.which("bash") is None, reason="needs make and bash"
)

# A build backend that prints what cargo prints while it compiles, to stderr as
# cargo does, then fails if asked to (FAKE_BUILD_FAIL).
BACKEND = textwrap.dedent(
    """
    import base64, hashlib, os, sys, time, zipfile

    def _wheel(directory):
        for crate in ("stratad-core", "stratad-py"):
            print(f"   Compiling {crate} v0.1.0", file=sys.stderr, flush=True)
            time.sleep(0.2)
        if os.environ.get("FAKE_BUILD_FAIL"):
            print("error: could not compile `stratad-py`", file=sys.stderr, flush=True)
            raise SystemExit(1)
        print("    Finished `release` profile [optimized] target(s)", file=sys.stderr, flush=True)
        name = "fakecore-0.1-py3-none-any.whl"
        files = {
            "fakecore.py": b"",
            "fakecore-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\\nName: fakecore\\n"
            b"Version: 0.1\\n",
            "fakecore-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\\nGenerator: test\\n"
            b"Root-Is-Purelib: true\\nTag: py3-none-any\\n",
        }
        record = []
        with zipfile.ZipFile(os.path.join(directory, name), "w") as wheel:
            for path, data in files.items():
                wheel.writestr(path, data)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                record.append(f"{path},sha256={digest.decode()},{len(data)}")
            record.append("fakecore-0.1.dist-info/RECORD,,")
            wheel.writestr("fakecore-0.1.dist-info/RECORD", "\\n".join(record) + "\\n")
        return name

    def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
        return _wheel(wheel_directory)

    def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
        return _wheel(wheel_directory)
    """
)


def outside_make() -> dict[str, str]:
    """The environment without a parent make's flags (under `make test`, MAKEFLAGS
    would make the child print "Entering/Leaving directory" lines)."""
    return {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}


def recipe(target: str) -> str:
    """What ``make TARGET`` would run when the venv is out of date (nothing is run)."""
    result = subprocess.run(
        ["make", "-f", str(MAKEFILE), "--dry-run", "-W", "pyproject.toml", target],
        cwd=ROOT,
        env=outside_make(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


@pytest.mark.parametrize("target", ["run", "dev"])
def test_the_stamp_recipe_announces_the_build_and_lets_pip_show_it(target: str) -> None:
    commands = recipe(target)
    assert PROGRESS_LINE in commands
    # The pip command that installs the project (and so builds the Rust core),
    # up to the end of its arguments (a pipe or redirection may follow).
    installs = re.findall(r"pip install ([^|>\"\n]*-e [^|>\"\n]*)", commands)
    assert installs, commands
    for arguments in installs:
        words = arguments.split()
        assert "--quiet" not in words and "-q" not in words, arguments
        assert "--verbose" in words or "-v" in words, arguments
    if target == "run":
        assert commands.splitlines()[-1] == ".venv/bin/stratad serve"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory the Makefile's $(STAMP) rule can install (its prerequisites exist)."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [build-system]
            requires = []
            build-backend = "backend"
            backend-path = ["."]

            [project]
            name = "fakecore"
            version = "0.1"

            [project.optional-dependencies]
            dev = []
            """
        )
    )
    (root / "Cargo.toml").write_text("")
    (root / "backend.py").write_text(BACKEND)
    return root


def make_dev(project: Path, **env: str) -> subprocess.CompletedProcess[str]:
    venv = project / ".venv"
    return subprocess.run(
        ["make", "-f", str(MAKEFILE), f"PYTHON={sys.executable}", f"VENV={venv}", "dev"],
        cwd=project,
        env={**outside_make(), "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_make_dev_prints_the_build_lines_as_they_come(project: Path) -> None:
    result = make_dev(project)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert PROGRESS_LINE in out
    compiled = [line.strip() for line in out.splitlines() if "Compiling" in line]
    assert compiled == ["Compiling stratad-core v0.1.0", "Compiling stratad-py v0.1.0"]
    assert out.index(PROGRESS_LINE) < out.index("Compiling") < out.index("Finished")
    assert "Successfully installed fakecore-0.1" in out
    # pip's own chatter stays in the log, not on the terminal.
    log = (project / ".venv" / "install.log").read_text()
    assert "Compiling stratad-core" in log
    assert len(out.splitlines()) < len(log.splitlines())
    assert (project / ".venv" / ".installed").exists()


def test_a_failed_build_fails_make_and_shows_why(project: Path) -> None:
    result = make_dev(project, FAKE_BUILD_FAIL="1")
    assert result.returncode != 0
    assert "could not compile `stratad-py`" in result.stdout
    assert "pip install failed" in result.stdout
    assert not (project / ".venv" / ".installed").exists()
