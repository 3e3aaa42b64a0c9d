"""A PersistentVolume stratad (uid 10001) cannot write: a readable crash, then the fix.

The pod's ``fsGroup: 10001`` makes most volume types group-writable, but a
hostPath volume ignores fsGroup: a hostPath directory owned by root (mode
0755) leaves the sidecar unable to create its lock file. It must crash-loop
with a message that says so (the agent never starts), and come up once the
directory is writable by uid 10001 (what docs/deploy.md tells the operator).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kube import STATE_DIR, Cluster, chart_values, helm_install, pod_ready, statuses

RELEASE = "on-hostpath"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"


@pytest.fixture
def root_owned_pv(cluster: Cluster) -> Iterator[tuple[str, Path]]:
    """A 1Gi hostPath PersistentVolume on a fresh directory with mode 0755, owned
    by whoever runs the tests (root: the cluster runs as root), not by 10001."""
    name = f"k8s-test-root-owned-{secrets.token_hex(3)}"
    directory = STATE_DIR / "pv-test" / name
    directory.mkdir(parents=True)
    directory.chmod(0o755)
    assert os.stat(directory).st_uid != 10001
    cluster.apply(
        "default",
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "hostPath": {"path": str(directory), "type": "Directory"},
                },
            }
        ],
    )
    try:
        yield name, directory
    finally:
        cluster.kubectl("delete", "pv", name, "--wait=true", "--timeout=120s", check=False)
        shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(OSError):  # the parent, once no test uses it
            directory.parent.rmdir()


def test_hostpath_volume_not_writable_by_10001(
    cluster: Cluster,
    helm: str,
    root_owned_pv: tuple[str, Path],
    ns: str,
    tmp_path: Path,
) -> None:
    pv, directory = root_owned_pv
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "agent-data"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": pv,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    cluster.apply(ns, [claim])
    values = chart_values()
    values["persistence"] = {"type": "pvc", "existingClaim": "agent-data"}
    helm_install(cluster, helm, ns, RELEASE, values, tmp_path)

    def crashed(pod: dict) -> bool:
        sidecar = statuses(pod).get("stratad", {})
        return "terminated" in sidecar.get("lastState", {})

    pod = cluster.wait_pod(ns, SELECTOR, crashed, "the sidecar to crash on the volume")
    name = pod["metadata"]["name"]
    status = statuses(pod)
    assert status["stratad"]["lastState"]["terminated"]["exitCode"] == 1, status["stratad"]
    assert not status["agent"].get("started") and "running" not in status["agent"]["state"]
    # fsGroup was set, and did not help: hostPath ignores it.
    assert pod["spec"]["securityContext"]["fsGroup"] == 10001
    logs = cluster.logs(ns, name, "stratad")
    assert "cannot open lock file /var/lib/stratad/LOCK: Permission denied" in logs, logs

    # The fix: make the directory writable by uid 10001. A new pod starts at once
    # (the old one would wait out its restart back-off first).
    os.chown(directory, 10001, 10001)
    cluster.kubectl("delete", "pod", "-n", ns, name, "--wait=false")
    fixed = cluster.wait_pod(
        ns, SELECTOR, pod_ready, "the pod to be Ready on the writable volume", exclude=(name,)
    )
    boot = cluster.wait_log(ns, fixed["metadata"]["name"], "agent", "AGENT-BOOT")
    assert boot["ok"], boot
    assert (directory / "LOCK").exists()
