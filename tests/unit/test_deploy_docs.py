"""docs/deploy.md's offline Helm rendering runs as written (issue #29).

Without a cluster, helm checks the chart's ``kubeVersion`` (>= 1.29) against a
version compiled into the helm binary: 1.20 for a helm built with ``go
install`` (as scripts/check_deploy.sh builds it), so ``helm template`` without
``--kube-version`` fails. The page's ``helm template`` block is run here as
written, with the helm that ``make deploy-check`` installs (which runs this
file), in a scratch directory where ``deploy/`` is the checkout's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "deploy.md"


def sh_blocks(page: Path) -> list[str]:
    """The bodies of the page's ``sh`` fenced blocks, marked or not."""
    found: list[str] = []
    body: list[str] | None = None
    for line in page.read_text(encoding="utf-8").splitlines():
        if body is None:
            if line.startswith("```sh"):
                body = []
        elif line.startswith("```"):
            found.append("\n".join(body) + "\n")
            body = None
        else:
            body.append(line)
    return found


def helm_template_blocks() -> list[str]:
    return [b for b in sh_blocks(PAGE) if "helm template" in b]


def helm() -> str | None:
    # Where scripts/check_deploy.sh installs it (STRATAD_TOOLS_DIR, else .tools).
    local = Path(os.environ.get("STRATAD_TOOLS_DIR") or ROOT / ".tools") / "bin" / "helm"
    return str(local) if local.exists() else shutil.which("helm")


def test_the_page_shows_an_offline_helm_template_that_names_the_kubernetes_version() -> None:
    blocks = helm_template_blocks()
    assert len(blocks) == 1, f"{PAGE.name}: expected one sh block running helm template"
    assert "--kube-version" in blocks[0]


def test_the_helm_template_block_runs_as_written(tmp_path: Path) -> None:
    found = helm()
    if found is None:
        pytest.skip("helm not installed (make deploy-check installs it into .tools/)")
    (block,) = helm_template_blocks()
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")
    path = os.pathsep.join([str(Path(found).parent), os.environ.get("PATH", "")])
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=tmp_path,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{block}\n{result.stdout}{result.stderr}"
    rendered = [p for p in tmp_path.iterdir() if p.suffix == ".yaml"]
    assert rendered, "the block wrote no .yaml file"
    docs = [d for p in rendered for d in yaml.safe_load_all(p.read_text()) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "Deployment", "NetworkPolicy"]
    (workload,) = (d for d in docs if d["kind"] == "Deployment")
    pod = workload["spec"]["template"]["spec"]
    images = [c["image"] for c in [*pod["initContainers"], *pod["containers"]]]
    assert "registry.example.com/my-agent:1.0.0" in images
    assert any(i.startswith("registry.example.com/stratad:") for i in images)
