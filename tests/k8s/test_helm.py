"""`helm install` of deploy/helm/stratad in a real cluster.

1. Default values (a Deployment, stratad as a native sidecar on an emptyDir,
   the unix socket, gRPC probes): the pod becomes Ready, the agent's first
   save over the STRATAD_ADDRESS the chart sets succeeds, both addresses
   serve, and the `stratad ctl ... stats` command the chart's NOTES print
   works as printed.
2. TLS and tokens (the README's recipe: a kubernetes.io/tls Secret, the
   identities file from `stratad ctl token new`, the agent's token Secret):
   the probes (`stratad ctl health` on the socket, since kubelet's gRPC
   probes cannot speak TLS) pass; the agent saves with its token over the
   socket and over TLS; a call without the token, or with a wrong one, is
   UNAUTHENTICATED; plaintext on the TLS port fails.

Only the images, pull policy and the agent's command and script volume are
set beyond what each case is about.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from kube import (
    Cluster,
    chart_values,
    container,
    env_list,
    helm_install,
    pod_ready,
    statuses,
)
from pki import Pki


def release_config(cluster: Cluster, ns: str, release: str) -> dict[str, object]:
    """The stratad.toml the release's ConfigMap holds."""
    return tomllib.loads(cluster.get(ns, "configmap", f"{release}-config")["data"]["stratad.toml"])


def test_default_values(cluster: Cluster, helm: str, ns: str, tmp_path: Path) -> None:
    release = "my-agent"
    values = chart_values(env_list(AGENT_START_COMMAND="addresses"))
    helm_install(cluster, helm, ns, release, values, tmp_path)
    pod = cluster.wait_pod(
        ns, f"app.kubernetes.io/instance={release}", pod_ready, "the release's pod to be Ready"
    )
    name = pod["metadata"]["name"]
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    sidecar = statuses(pod)["stratad"]
    assert sidecar["started"] and sidecar["ready"] and sidecar["restartCount"] == 0, sidecar
    spec = container(pod["spec"], "stratad")
    assert spec["restartPolicy"] == "Always"
    assert spec["readinessProbe"]["grpc"]["port"] == 50051
    assert "emptyDir" in next(v for v in pod["spec"]["volumes"] if v["name"] == "stratad-data")

    config = release_config(cluster, ns, release)
    assert config["listen_unix"] == "/var/run/stratad/stratad.sock"

    boot = cluster.wait_log(ns, name, "agent", "AGENT-BOOT")
    assert boot["ok"], boot
    assert boot["address"] == "unix:/var/run/stratad/stratad.sock"
    start = cluster.wait_log(ns, name, "agent", "AGENT-START")
    assert start["ok"], start
    assert all(s["same_bytes"] for s in start["result"]["saves"]), start

    # The NOTES' "Operate it" command, run as printed (in the release's namespace).
    notes = subprocess.run(
        [helm, "get", "notes", release, "-n", ns],
        env=cluster.env, capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    (command,) = [ln.strip() for ln in notes.splitlines() if ln.strip().startswith("kubectl exec")]
    argv = shlex.split(command)
    assert argv[:2] == ["kubectl", "exec"], argv
    stats = cluster.kubectl("exec", "-n", ns, *argv[2:]).stdout
    assert "sessions" in stats and "checkpoints" in stats, stats


def test_tls_and_token(cluster: Cluster, helm: str, ns: str, tmp_path: Path, pki: Pki) -> None:
    release = "secure-agent"
    # The daemon's certificate names 127.0.0.1 and localhost: what the agent dials.
    server = pki.server()
    tls_secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": "stratad-tls"},
        "stringData": {
            "tls.crt": server.cert_pem.decode(),
            "tls.key": server.key_pem.decode(),
            "ca.crt": pki.ca_pem.decode(),
        },
    }
    # The README's recipe: line 1 the token, line 2 its entry for the identities file.
    made = subprocess.run(
        [sys.executable, "-m", "stratad", "ctl", "token", "new", "--for-tenant", "acme",
         "--role", "agent", "--name", "k8s-agent"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.splitlines()  # fmt: skip
    token, entry = made[0], made[1]
    secrets = [
        tls_secret,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "stratad-identities"},
            "stringData": {"tokens.toml": f"[tokens]\n{entry}\n"},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "my-agent-stratad-token"},
            "stringData": {"token": token + "\n"},
        },
    ]
    cluster.apply(ns, secrets)

    values = chart_values()
    values["tls"] = {"enabled": True, "secretName": "stratad-tls"}
    values["auth"] = {
        "mode": "token",
        "tokensSecret": "stratad-identities",
        "agentTokenSecret": "my-agent-stratad-token",
    }
    # The agent verifies the daemon with the CA (the Secret's ca.crt only).
    values["agent"]["volumeMounts"].append(
        {"name": "stratad-ca", "mountPath": "/etc/agent-ca", "readOnly": True}
    )
    values["agent"]["extraVolumes"].append(
        {
            "name": "stratad-ca",
            "secret": {"secretName": "stratad-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
        }
    )
    helm_install(cluster, helm, ns, release, values, tmp_path)
    pod = cluster.wait_pod(
        ns, f"app.kubernetes.io/instance={release}", pod_ready, "the release's pod to be Ready"
    )
    name = pod["metadata"]["name"]
    spec = container(pod["spec"], "stratad")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert spec[probe]["exec"]["command"][:2] == ["stratad", "ctl"], spec[probe]
    sidecar = statuses(pod)["stratad"]
    assert sidecar["ready"] and sidecar["restartCount"] == 0, sidecar
    config = release_config(cluster, ns, release)
    assert config["auth"] == "token" and "allow_insecure" not in config, config

    # The agent's first save: over the socket, with the token the chart mounted.
    boot = cluster.wait_log(ns, name, "agent", "AGENT-BOOT")
    assert boot["ok"], boot

    results = cluster.exec_json(ns, name, "auth", {"ca_file": "/etc/agent-ca/ca.crt"})
    for ok in ("socket_token", "tls_token"):
        assert results[ok]["ok"] and results[ok]["same_bytes"], (ok, results[ok])
    for refused, reason in (
        ("socket_no_token", "MISSING_CREDENTIALS"),
        ("tls_no_token", "MISSING_CREDENTIALS"),
        ("tls_wrong_token", "INVALID_TOKEN"),
    ):
        error = results[refused].get("error", {})
        assert not results[refused]["ok"], (refused, results[refused])
        assert error["grpc_status"] == "UNAUTHENTICATED", (refused, error)
        assert error["reason"] == reason, (refused, error)
    plaintext = results["plaintext_token"]
    assert not plaintext["ok"] and plaintext["error"]["grpc_status"] == "UNAVAILABLE", plaintext
