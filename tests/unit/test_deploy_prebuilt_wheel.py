"""deploy/docker/prebuilt-wheel.sh: the image takes a prebuilt wheel only if it
matches the sources (docs/deploy.md, section 1).

`make image` hands the Dockerfile's builder stage the wheel `make wheel` built
(STRATAD_WHEEL=<file>) instead of compiling the Rust core again; the script
must refuse a wheel from other sources, since the image would then ship code
that is not the checkout's. These tests make wheel-shaped zips of this
checkout's python/stratad (no Rust build needed) and change one thing at a time.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "docker" / "prebuilt-wheel.sh"
VERSION = re.search(r'^version = "(.+)"$', (ROOT / "Cargo.toml").read_text(), re.M)[1]  # type: ignore[index]
TAG = "cp311-abi3-manylinux_2_34_x86_64"


def sources() -> dict[str, bytes]:
    base = ROOT / "python"
    return {
        str(p.relative_to(base)): p.read_bytes()
        for p in (base / "stratad").rglob("*")
        if p.suffix in (".py", ".pyi") and "__pycache__" not in p.parts
    }


def make_wheel(directory: Path, files: dict[str, bytes], version: str = VERSION) -> Path:
    wheel = directory / f"stratad-{version}-{TAG}.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("stratad/_core.abi3.so", b"\x7fELF not really")
        zf.writestr(f"stratad-{version}.dist-info/METADATA", f"Name: stratad\nVersion: {version}\n")
    return wheel


def run(wheel: Path, dist: Path) -> subprocess.CompletedProcess[str]:
    # From the checkout's root, as the builder stage runs it from the context's copy.
    return subprocess.run(
        ["bash", str(SCRIPT), str(wheel), str(dist)],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_wheel_of_these_sources_is_copied(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, sources())
    result = run(wheel, tmp_path / "dist")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "dist" / wheel.name).read_bytes() == wheel.read_bytes()
    assert "Python files match the sources" in result.stdout


@pytest.mark.parametrize("change", ["edited", "missing", "extra"])
def test_a_wheel_of_other_sources_is_refused(tmp_path: Path, change: str) -> None:
    files = sources()
    if change == "edited":
        files["stratad/cli.py"] += b"\n# built from another checkout\n"
    elif change == "missing":
        del files["stratad/cli.py"]
    else:
        files["stratad/leftover.py"] = b"# a module the sources no longer have\n"
    result = run(make_wheel(tmp_path, files), tmp_path / "dist")
    assert result.returncode != 0
    assert "was not built from these sources" in result.stderr, result.stderr
    assert "stratad/cli.py" in result.stderr or "stratad/leftover.py" in result.stderr
    assert not (tmp_path / "dist").exists()


def test_another_version_is_refused(tmp_path: Path) -> None:
    result = run(make_wheel(tmp_path, sources(), version="0.0.1"), tmp_path / "dist")
    assert result.returncode != 0
    assert f"is version 0.0.1, the sources are {VERSION}" in result.stderr


def test_a_missing_wheel_says_what_there_is(tmp_path: Path) -> None:
    make_wheel(tmp_path, sources())
    result = run(tmp_path / "stratad-9.9.9-nope.whl", tmp_path / "dist")
    assert result.returncode != 0
    assert f"stratad-{VERSION}-{TAG}.whl" in result.stderr, result.stderr
    assert "make wheel" in result.stderr
