"""Fixtures for tests/k8s: the stratad sidecar in real Kubernetes pods (`make k8s-test`).

- ``cluster``: the one-node cluster of scripts/k8s/cluster.sh (a `kube.Cluster`),
  with the ``stratad:dev`` image (`make image`) loaded into its containerd once
  per session. Every test here is skipped, with the reason, when no cluster
  answers ``cluster.sh status`` or the image is missing; with
  STRATAD_REQUIRE_K8S=1 (what `make k8s-test` sets) they fail instead.
- ``ns``: a fresh namespace for the test, holding the agent script's
  ConfigMap (tests/k8s/k8s_agent.py). Its deletion starts when the test ends
  (its pods stop gracefully while the next test runs); the session waits for
  every one at its end. ``new_namespace(stem)`` makes one for a module-scoped
  fixture.
- ``node_ip``: the node's InternalIP: a host process listening there is
  reachable from pods (there is no kube-proxy, and no cluster DNS).
- ``helm``: the helm binary `make deploy-check` installs (.tools/bin/helm),
  installed the same way when missing; run it with ``cluster.env`` (the
  cluster's kubeconfig).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from kube import CLUSTER_SH, IMAGE, ROOT, STATE_DIR, Cluster, namespace, wait_deleted

TOOLS = Path(os.environ.get("STRATAD_TOOLS_DIR") or ROOT / ".tools")
# PersistentVolumes of the cluster's pool a run binds: the StatefulSet's claim.
PVS_NEEDED = 2


def _required() -> bool:
    return os.environ.get("STRATAD_REQUIRE_K8S", "") not in ("", "0")


def _unavailable(reason: str) -> None:
    if _required():
        pytest.fail(f"STRATAD_REQUIRE_K8S is set but {reason}", pytrace=False)
    pytest.skip(reason)


def _cluster_sh(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    if not CLUSTER_SH.exists():
        _unavailable(f"{CLUSTER_SH.relative_to(ROOT)} is missing")
    status = _cluster_sh("status")
    if status.returncode != 0:
        said = (status.stdout + status.stderr).strip()[-500:]
        _unavailable(
            f"no Kubernetes cluster answers (`scripts/k8s/cluster.sh status` exited "
            f"{status.returncode}{': ' + said if said else ''}): run `make k8s-up`"
        )
    kubeconfig = STATE_DIR / "kubeconfig"
    if not kubeconfig.exists():
        _unavailable(f"the cluster is up but {kubeconfig} is missing")
    if shutil.which("docker") is None:
        _unavailable("no docker client: the image stratad:dev comes from `make image`")
    inspect = subprocess.run(
        ["docker", "image", "inspect", IMAGE], capture_output=True, text=True, check=False
    )
    if inspect.returncode != 0:
        _unavailable(f"the image {IMAGE} is not built: run `make image`")
    loaded = _cluster_sh("load-image", IMAGE, timeout=240)
    if loaded.returncode != 0:
        pytest.fail(
            f"cluster.sh load-image {IMAGE} failed:\n{loaded.stdout}{loaded.stderr}", pytrace=False
        )
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    cluster = Cluster(["bash", str(CLUSTER_SH), "kubectl"], env)
    # Earlier runs' StatefulSet claims leave their hostPath volumes Released
    # (reclaim policy Retain). When few are left Available, make the Released
    # ones Available again (emptied).
    volumes = cluster.get("default", "pv", "-l", "stratad-k8s/pv=true")["items"]
    available = [v for v in volumes if v.get("status", {}).get("phase") == "Available"]
    if len(available) < PVS_NEEDED:
        recycled = _cluster_sh("recycle-pvs", timeout=300)
        if recycled.returncode != 0:
            pytest.fail(f"cluster.sh recycle-pvs failed:\n{recycled.stderr}", pytrace=False)
    return cluster


@pytest.fixture(scope="session")
def node_ip(cluster: Cluster) -> str:
    result = _cluster_sh("node-ip")
    assert result.returncode == 0, result.stdout + result.stderr
    ip = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"[0-9.]+|[0-9a-f:]+", ip), f"node-ip printed {result.stdout!r}"
    return ip


def _namespace_name(stem: str) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:40].strip("-")
    return f"k8s-{stem}-{secrets.token_hex(3)}"


@pytest.fixture(scope="session")
def deleting_namespaces(cluster: Cluster) -> Iterator[list[str]]:
    """Namespaces whose deletion tests started; the session waits for them at its end."""
    deleting: list[str] = []
    yield deleting
    wait_deleted(cluster, deleting)


@pytest.fixture(scope="session")
def new_namespace(
    cluster: Cluster, deleting_namespaces: list[str]
) -> Callable[[str], AbstractContextManager[str]]:
    def make(stem: str) -> AbstractContextManager[str]:
        return namespace(cluster, _namespace_name(stem), deleting_namespaces)

    return make


@pytest.fixture
def ns(
    cluster: Cluster, deleting_namespaces: list[str], request: pytest.FixtureRequest
) -> Iterator[str]:
    """The test's own namespace."""
    name = _namespace_name(request.node.name.removeprefix("test_"))
    with namespace(cluster, name, deleting_namespaces) as created:
        yield created


HELM_VERSION_LINE = re.compile(r"^HELM_VERSION=(\S+)$", re.M)


@pytest.fixture(scope="session")
def helm(cluster: Cluster) -> str:
    """.tools/bin/helm, installed as scripts/check_deploy.sh does when missing."""
    path = TOOLS / "bin" / "helm"
    if path.exists():
        return str(path)
    match = HELM_VERSION_LINE.search((ROOT / "scripts" / "check_deploy.sh").read_text())
    assert match, "no HELM_VERSION in scripts/check_deploy.sh"
    version = match.group(1)
    if shutil.which("go") is None:
        _unavailable(f"{path} is missing and there is no go to build it: run `make deploy-check`")
    env = {
        **os.environ,
        "GOBIN": str(TOOLS / "bin"),
        "GOCACHE": str(TOOLS / "go" / "cache"),
        "GOMODCACHE": str(TOOLS / "go" / "mod"),
        "GOFLAGS": "-modcacherw",
        "GOTOOLCHAIN": "local",
    }
    ldflags = f"-s -w -X helm.sh/helm/v3/internal/version.version={version}"
    subprocess.run(
        ["go", "install", "-trimpath", "-ldflags", ldflags, f"helm.sh/helm/v3/cmd/helm@{version}"],
        env=env,
        check=True,
        timeout=1500,
    )
    (TOOLS / "bin" / ".helm.version").write_text(version + "\n")
    return str(path)
