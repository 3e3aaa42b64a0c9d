"""The Kubernetes manifests and the Helm chart say what docs/deploy.md promises.

Schema validity is checked by kubeconform in scripts/check_deploy.sh; these
tests check meaning: a native sidecar with gRPC probes on the port stratad
listens on and the end of its log as termination message when it fails, a
locked-down security context, resources, a grace period longer than stratad's
drain, the data directory on a volume, and a ConfigMap whose stratad.toml
stratad's own config loader accepts. They run on deploy/k8s/ and,
when helm is at hand (.tools/bin/helm, installed by `make deploy-check`, or
STRATAD_RENDERED_DIR pointing at rendered output), on the chart's renderings.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stratad.config import Config, load_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
CHART = ROOT / "deploy" / "helm" / "stratad"
DATA_DIR = "/var/lib/stratad"
WORKLOADS = ("Deployment", "StatefulSet")

Doc = dict[str, Any]


def load_docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def plain_docs() -> list[Doc]:
    return [d for f in sorted(K8S.glob("*.yaml")) for d in load_docs(f)]


def _helm() -> str | None:
    # Where scripts/check_deploy.sh installs it (STRATAD_TOOLS_DIR, else .tools).
    local = Path(os.environ.get("STRATAD_TOOLS_DIR") or ROOT / ".tools") / "bin" / "helm"
    return str(local) if local.exists() else shutil.which("helm")


def rendered_cases(tmp_dir: Path) -> dict[str, list[Doc]]:
    """The chart rendered with its default values and each ci/ values file."""
    given = os.environ.get("STRATAD_RENDERED_DIR")
    if given:
        return {f.stem: load_docs(f) for f in sorted(Path(given).glob("*.yaml"))}
    helm = _helm()
    if helm is None:
        pytest.skip("helm not installed (make deploy-check installs it into .tools/)")
    cases: dict[str, list[Doc]] = {}
    for values in [None, *sorted((CHART / "ci").glob("*-values.yaml"))]:
        name = "default" if values is None else values.name.removesuffix("-values.yaml")
        args = [helm, "template", "stratad", str(CHART), "--kube-version", "1.29.0"]
        if values is not None:
            args += ["--values", str(values)]
        out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout
        cases[name] = [d for d in yaml.safe_load_all(out) if d]
    return cases


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Doc]]:
    cases = rendered_cases(tmp_path_factory.mktemp("rendered"))
    assert cases, "no rendered chart"
    return cases


# --- the checks, shared by plain manifests and chart renderings ----------------------------


def workloads(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d.get("kind") in WORKLOADS]


def container(pod: Doc, name: str, init: bool) -> Doc:
    key = "initContainers" if init else "containers"
    matches = [c for c in pod.get(key, []) if c["name"] == name]
    assert matches, f"no {key} entry named {name}"
    return matches[0]


def config_of(docs: list[Doc], pod: Doc, tmp_path: Path) -> Config:
    """The stratad.toml the sidecar reads, loaded by stratad itself."""
    stratad = container(pod, "stratad", init=True)
    mounts = {m["mountPath"]: m["name"] for m in stratad["volumeMounts"]}
    config_path = next(e["value"] for e in stratad["env"] if e["name"] == "STRATAD_CONFIG")
    volume_name = mounts[str(Path(config_path).parent)]
    volume = next(v for v in pod["volumes"] if v["name"] == volume_name)
    configmap_name = volume["configMap"]["name"]
    configmap = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == configmap_name
    )
    toml = tmp_path / f"{configmap_name}.toml"
    toml.write_text(configmap["data"][Path(config_path).name])
    return load_config(config_file=toml)  # raises ConfigError naming a bad key


MIB = 1 << 20
_BINARY_SUFFIXES = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def quantity(value: str | int) -> int:
    """A Kubernetes memory quantity in bytes (the binary suffixes, or a plain number)."""
    text = str(value)
    for suffix, factor in _BINARY_SUFFIXES.items():
        if text.endswith(suffix):
            return int(text.removesuffix(suffix)) * factor
    return int(text)


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def check_workload(docs: list[Doc], workload: Doc, tmp_path: Path) -> None:
    pod = workload["spec"]["template"]["spec"]
    stratad = container(pod, "stratad", init=True)
    config = config_of(docs, pod, tmp_path)

    # A native sidecar: an init container that keeps running.
    assert stratad["restartPolicy"] == "Always"
    assert stratad.get("args", ["serve"])[0] == "serve"
    # When it exits with an error (a bad stratad.toml), the end of its log is the
    # termination message, so `kubectl describe pod` shows why (docs/deploy.md).
    assert stratad.get("terminationMessagePolicy") == "FallbackToLogsOnError"

    # gRPC probes on the health service, on the port stratad listens on (pod IP).
    assert config.listen.startswith("0.0.0.0:"), "kubelet probes dial the pod IP"
    grpc_port = port_of(config.listen)
    ports = {p["name"]: p["containerPort"] for p in stratad["ports"]}
    assert ports["grpc"] == grpc_port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check_probe(stratad[probe], config, grpc_port, probe)
    check_security(pod, stratad, config)

    # Metrics on the port the config names, and annotated for scraping.
    if config.metrics_listen:
        assert ports["metrics"] == port_of(config.metrics_listen)
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        if "prometheus.io/port" in annotations:
            assert annotations["prometheus.io/port"] == str(ports["metrics"])
    else:
        assert "metrics" not in ports

    # Locked down, for every container of the pod.
    pod_security = pod.get("securityContext", {})
    assert pod_security.get("runAsNonRoot") is True
    assert pod_security.get("seccompProfile", {}).get("type") == "RuntimeDefault"
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        security = c["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, c["name"]
        assert security["allowPrivilegeEscalation"] is False, c["name"]
        assert security["capabilities"]["drop"] == ["ALL"], c["name"]
        assert security.get("runAsNonRoot", True) is True, c["name"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), (c["name"], kind)
    assert pod.get("automountServiceAccountToken") is False

    # The in-flight budget fits in the container, with room for the daemon
    # itself and the objects not yet written (docs/limits.md).
    memory_limit = quantity(stratad["resources"]["limits"]["memory"])
    assert 0 < config.max_inflight_bytes <= memory_limit - 128 * MIB

    # The pod outlives stratad's drain (and the agent's own shutdown).
    assert pod["terminationGracePeriodSeconds"] >= config.grace_period + 15

    # The data directory is a volume: emptyDir or a PersistentVolumeClaim.
    assert str(config.data_dir) == DATA_DIR
    mounts = {m["mountPath"]: m["name"] for m in stratad["volumeMounts"]}
    data_volume = mounts[DATA_DIR]
    if workload["kind"] == "StatefulSet":
        templates = [t["metadata"]["name"] for t in workload["spec"]["volumeClaimTemplates"]]
        assert data_volume in templates
        assert data_volume not in {v["name"] for v in pod["volumes"]}
    else:
        volume = next(v for v in pod["volumes"] if v["name"] == data_volume)
        assert "emptyDir" in volume or "persistentVolumeClaim" in volume
        if "persistentVolumeClaim" in volume:
            assert workload["spec"]["replicas"] == 1
            assert workload["spec"]["strategy"]["type"] == "Recreate"

    # The agent finds stratad: on the shared unix socket, or on loopback.
    agent = pod["containers"][0]
    address = next(e["value"] for e in agent["env"] if e["name"] == "STRATAD_ADDRESS")
    if config.listen_unix:
        assert address == config.listen_unix
        socket_dir = str(Path(config.listen_unix.removeprefix("unix:")).parent)
        for c in (stratad, agent):
            assert socket_dir in {m["mountPath"] for m in c["volumeMounts"]}, c["name"]
        socket_volume = next(v for v in pod["volumes"] if v["name"] == mounts[socket_dir])
        assert "emptyDir" in socket_volume
    else:
        assert address == f"127.0.0.1:{grpc_port}"


def check_probe(probe: Doc, config: Config, grpc_port: int, name: str) -> None:
    """gRPC health on the port; with TLS (which kubelet's gRPC probes cannot speak),
    `stratad ctl health` on the plaintext unix socket."""
    if not config.tls:
        assert probe["grpc"]["port"] == grpc_port, name
        assert "service" not in probe["grpc"]  # "" = the whole server
        return
    assert config.listen_unix, "a TLS probe needs the unix socket"
    command = probe["exec"]["command"]
    assert command[:2] == ["stratad", "ctl"] and command[-1] == "health", name
    assert command[command.index("--address") + 1] == config.listen_unix, name
    assert probe.get("timeoutSeconds", 1) >= 5, name  # a Python process per probe


def mounted_files(pod: Doc, container: Doc) -> dict[str, Doc]:
    """Mount path -> the pod volume mounted there."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: volumes.get(m["name"], {}) for m in container["volumeMounts"]}


def check_security(pod: Doc, stratad: Doc, config: Config) -> None:
    """Plaintext beyond loopback only if asked for; TLS and identity files from Secrets."""
    assert config.allow_insecure != config.tls  # plaintext on the pod IP is an explicit choice
    mounts = mounted_files(pod, stratad)
    secret_files = [config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file]
    # Encryption at rest: the master keys too come from a Secret, never the ConfigMap.
    key_files = [config.encryption_key_file, *config.encryption_old_key_files]
    for path in [*secret_files, config.auth_tokens_file, *key_files]:
        if path:
            volume = mounts[str(Path(path).parent)]
            assert "secret" in volume, path
            # A subPath mount would never see the Secret's updates: no reloads.
            assert all("subPath" not in m for m in stratad["volumeMounts"])
    agent = pod["containers"][0]
    token_file = next((e["value"] for e in agent["env"] if e["name"] == "STRATAD_TOKEN_FILE"), "")
    if token_file:
        assert "secret" in mounted_files(pod, agent)[str(Path(token_file).parent)]


def test_chart_refuses_tls_without_probes_and_grpc_ingress_without_auth(tmp_path: Path) -> None:
    helm = _helm()
    if helm is None:
        pytest.skip("helm not installed (make deploy-check installs it into .tools/)")
    base = [helm, "template", "stratad", str(CHART), "--kube-version", "1.29.0"]
    cases = {
        "stratad.socketDir": ["tls.enabled=true", "tls.secretName=s", "stratad.socketDir="],
        "networkPolicy.grpcFrom": ["networkPolicy.grpcFrom[0].podSelector.matchLabels.a=b"],
        "tls.clientAuth": ["auth.mode=mtls", "auth.tokensSecret=t"],
        "set from the chart's tls and auth values": ["stratad.config.allow_insecure=false"],
        "encryption.keySecret": ["encryption.enabled=true"],
    }
    for words, settings in cases.items():
        args = [*base, *(a for setting in settings for a in ("--set", setting))]
        result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode != 0 and words in result.stderr, (settings, result.stderr)


def check_docs(docs: list[Doc], tmp_path: Path) -> set[str]:
    found = workloads(docs)
    assert found, "no Deployment or StatefulSet"
    for workload in found:
        check_workload(docs, workload, tmp_path)
    for statefulset in (d for d in found if d["kind"] == "StatefulSet"):
        services = {
            d["metadata"]["name"]: d
            for d in docs
            if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"
        }
        assert statefulset["spec"]["serviceName"] in services, "headless service missing"
    return {w["kind"] for w in found}


# --- plain manifests ---------------------------------------------------------------------


def test_plain_manifests_have_a_deployment_and_a_statefulset(tmp_path: Path) -> None:
    kinds = check_docs(plain_docs(), tmp_path)
    assert kinds == {"Deployment", "StatefulSet"}


def test_plain_network_policy_admits_only_the_metrics_port() -> None:
    policy = next(d for d in plain_docs() if d["kind"] == "NetworkPolicy")
    ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert ports == [9464]


def test_image_config_is_valid_and_serves_on_the_pod_ip() -> None:
    config = load_config(config_file=ROOT / "deploy" / "docker" / "stratad.toml")
    assert config.listen == "0.0.0.0:50051"
    assert config.allow_insecure  # for kubelet's gRPC probes, which cannot speak TLS
    assert str(config.data_dir) == DATA_DIR
    assert config.metrics_listen == "0.0.0.0:9464"
    assert config.listen_unix == ""  # a read-only root filesystem has no place for it


def test_dockerfile_static_rules() -> None:
    spec = importlib.util.spec_from_file_location(
        "check_dockerfile", ROOT / "scripts" / "check_dockerfile.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    assert list(module.static_checks(ROOT / "deploy" / "Dockerfile")) == []


# --- the Helm chart ----------------------------------------------------------------------


def test_chart_renderings(rendered: dict[str, list[Doc]], tmp_path: Path) -> None:
    kinds = set()
    for name, docs in rendered.items():
        try:
            kinds |= check_docs(docs, tmp_path)
        except AssertionError as exc:
            raise AssertionError(f"chart case {name}: {exc}") from exc
    assert kinds == {"Deployment", "StatefulSet"}


def test_chart_default_is_the_plain_deployment(rendered: dict[str, list[Doc]]) -> None:
    """The chart's defaults produce what deploy/k8s/deployment.yaml shows."""
    chart_pod = workloads(rendered["default"])[0]["spec"]["template"]["spec"]
    plain = next(d for d in plain_docs() if d["kind"] == "Deployment")
    plain_pod = plain["spec"]["template"]["spec"]
    a, b = container(chart_pod, "stratad", True), container(plain_pod, "stratad", True)
    for key in ("startupProbe", "readinessProbe", "livenessProbe", "resources", "ports"):
        assert a[key] == b[key], key
    assert a["securityContext"] == b["securityContext"]
    assert chart_pod["securityContext"] == plain_pod["securityContext"]
    assert chart_pod["terminationGracePeriodSeconds"] == plain_pod["terminationGracePeriodSeconds"]


# --- documentation -------------------------------------------------------------------------


def test_configuration_doc_lists_every_key() -> None:
    from stratad.config import OPTIONS

    doc = (ROOT / "docs" / "configuration.md").read_text()
    for option in OPTIONS:
        row = f"| `{option.name}` | `{option.flag}` | `{option.env_var}` |"
        assert row in doc, f"docs/configuration.md lacks {option.name}"


def _leaf_values(values: dict[str, Any], prefix: str = "") -> list[str]:
    names = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in DOCUMENTED_AS_A_WHOLE:
            names += _leaf_values(value, name + ".")
        else:
            names.append(name)
    return names


#: Values whose sub-keys are the object they configure, documented as one row.
DOCUMENTED_AS_A_WHOLE = {
    "podSecurityContext", "resources", "securityContext", "config", "emptyDir",
    "startupProbe", "readinessProbe", "livenessProbe",
}  # fmt: skip


def test_chart_readme_documents_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    for name in _leaf_values(values):
        assert f"`{name}`" in readme, f"deploy/helm/stratad/README.md lacks {name}"
