"""Helpers for tests/k8s: kubectl, waiting, and the manifests made into test pods.

The cluster is scripts/k8s/cluster.sh's one-node Kubernetes; every kubectl call
goes through its admin kubeconfig. Manifests are applied as a user would apply
them, with only what a test must change: the images (``stratad:dev``, the image
the tests run, also as the agent: its Python has the SDK), the agent's command
(tests/k8s/k8s_agent.py from a ConfigMap), sizes the test cluster can give, and
stratad.toml keys a test names.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = ROOT / "deploy" / "k8s"
CHART = ROOT / "deploy" / "helm" / "stratad"
CLUSTER_SH = ROOT / "scripts" / "k8s" / "cluster.sh"
# cluster.sh's state directory: the admin kubeconfig is there.
STATE_DIR = Path(os.environ.get("STRATAD_K8S_STATE") or "/var/tmp/stratad-k8s")
AGENT_SCRIPT = Path(__file__).resolve().parent / "k8s_agent.py"

IMAGE = os.environ.get("STRATAD_K8S_IMAGE", "stratad:dev")
# The image's Python, with the stratad SDK.
PYTHON = "/opt/stratad/bin/python"
AGENT_CONFIGMAP = "k8s-agent"
AGENT_COMMAND = [PYTHON, "/agent/k8s_agent.py", "serve"]
# Generous but bounded: a pod start on the test machine takes seconds.
WAIT = 120.0

T = TypeVar("T")
Doc = dict[str, Any]


class Cluster:
    """kubectl against the test cluster, and waiting on what it reports."""

    def __init__(self, kubectl: list[str], env: dict[str, str]) -> None:
        self._kubectl = kubectl
        self.env = env

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 90.0,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*self._kubectl, *args],
            input=input,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def kubectl_popen(self, *args: str, stdout: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*self._kubectl, *args], env=self.env, stdout=stdout, stderr=subprocess.STDOUT
        )

    def get(self, namespace: str, *what: str) -> Any:
        """``kubectl get WHAT -o json``, parsed; None when it does not exist."""
        result = self.kubectl("get", "-n", namespace, *what, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise AssertionError(f"kubectl get {' '.join(what)}: {result.stderr}")
        return json.loads(result.stdout)

    def pods(self, namespace: str, selector: str = "") -> list[Doc]:
        args = ["pods"] + (["-l", selector] if selector else [])
        items: list[Doc] = self.get(namespace, *args)["items"]
        return items

    def apply(self, namespace: str, docs: list[Doc]) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))

    def logs(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        previous: bool = False,
        timestamps: bool = False,
    ) -> str:
        args = ["logs", "-n", namespace, pod, "-c", container]
        if previous:
            args.append("--previous")
        if timestamps:
            args.append("--timestamps")
        result = self.kubectl(*args, check=False)
        return result.stdout if result.returncode == 0 else ""

    def exec_json(
        self, namespace: str, pod: str, command: str, args: dict[str, Any], timeout: float = 120
    ) -> Any:
        """Run ``k8s_agent.py COMMAND JSON`` in the pod's agent container."""
        result = self.kubectl(
            "exec", "-n", namespace, pod, "-c", "agent", "--",
            PYTHON, "/agent/k8s_agent.py", command, json.dumps(args),
            check=False, timeout=timeout,
        )  # fmt: skip
        if result.returncode != 0:
            raise AssertionError(
                f"k8s_agent.py {command} in {pod} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}\n{self.diagnostics(namespace)}"
            )
        return json.loads(result.stdout.strip().splitlines()[-1])

    def diagnostics(self, namespace: str) -> str:
        """What a failed wait prints: pods, events, each container's last log lines."""
        parts = []
        for args in (
            ("get", "pods,pvc", "-n", namespace, "-o", "wide"),
            ("get", "events", "-n", namespace, "--sort-by=.lastTimestamp"),
            ("describe", "pods", "-n", namespace),
        ):
            result = self.kubectl(*args, check=False)
            parts.append(f"$ kubectl {' '.join(args)}\n{result.stdout}{result.stderr}")
        with contextlib.suppress(Exception):
            for pod in self.pods(namespace):
                name = pod["metadata"]["name"]
                spec = pod["spec"]
                for c in [*spec.get("initContainers", []), *spec["containers"]]:
                    tail = self.logs(namespace, name, c["name"])[-3000:]
                    parts.append(f"--- logs {name}/{c['name']}:\n{tail}")
        return "\n".join(parts)

    def wait(
        self,
        namespace: str,
        what: str,
        probe: Callable[[], T | None],
        timeout: float = WAIT,
        interval: float = 0.5,
    ) -> T:
        """Call ``probe`` until it returns something other than None/False."""
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value is not None and value is not False:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {what}\n"
                    f"{self.diagnostics(namespace)}"
                )
            time.sleep(interval)

    def wait_pod(
        self,
        namespace: str,
        selector: str,
        ready: Callable[[Doc], bool],
        what: str,
        exclude: tuple[str, ...] = (),
        timeout: float = WAIT,
    ) -> Doc:
        """The one pod matching ``selector`` (and not named in ``exclude``) once
        ``ready(pod)`` holds."""

        def probe() -> Doc | None:
            pods = [
                p
                for p in self.pods(namespace, selector)
                if p["metadata"]["name"] not in exclude
                and not p["metadata"].get("deletionTimestamp")
            ]
            if len(pods) == 1 and ready(pods[0]):
                return pods[0]
            return None

        return self.wait(namespace, what, probe, timeout)

    def wait_gone(self, namespace: str, kind: str, name: str, timeout: float = WAIT) -> None:
        self.wait(
            namespace, f"{kind}/{name} to be gone", lambda: self.get(namespace, kind, name) is None,
            timeout,
        )  # fmt: skip

    def wait_log(
        self, namespace: str, pod: str, container: str, tag: str, timeout: float = WAIT
    ) -> Any:
        """The JSON after ``tag`` on the first container log line starting with it."""

        def probe() -> Any:
            for line in self.logs(namespace, pod, container).splitlines():
                if line.startswith(tag + " "):
                    return json.loads(line[len(tag) + 1 :])
            return None

        return self.wait(namespace, f"{tag} in the logs of {pod}/{container}", probe, timeout)


# --- pod status --------------------------------------------------------------------


def statuses(pod: Doc) -> dict[str, Doc]:
    """Container statuses by name, init containers (the sidecar) included."""
    status = pod.get("status", {})
    return {
        s["name"]: s
        for s in [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]
    }


def condition(pod: Doc, kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def pod_ready(pod: Doc) -> bool:
    return condition(pod, "Ready")


def parse_time(text: str) -> datetime.datetime:
    """An RFC 3339 time as Kubernetes writes it (nanoseconds cut to microseconds)."""
    text = text.replace("Z", "+00:00")
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)
    return datetime.datetime.fromisoformat(text)


def timestamped(log: str) -> list[tuple[float, str]]:
    """``kubectl logs --timestamps`` output as (epoch seconds, line)."""
    out = []
    for line in log.splitlines():
        stamp, _, rest = line.partition(" ")
        with contextlib.suppress(ValueError):
            out.append((parse_time(stamp).timestamp(), rest))
    return out


class LogStream:
    """``kubectl logs -f --timestamps`` of one container into a file, until it exits."""

    def __init__(self, cluster: Cluster, namespace: str, pod: str, container: str, path: Path):
        self.path = path
        self._file = path.open("wb")
        self.proc = cluster.kubectl_popen(
            "logs", "-f", "--timestamps", "-n", namespace, pod, "-c", container, stdout=self._file
        )

    def finish(self, timeout: float = 30.0) -> list[tuple[float, str]]:
        """Wait for the stream to end (the container stopped), then its lines."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self._file.close()
        return timestamped(self.path.read_text(errors="replace"))


# --- manifests ---------------------------------------------------------------------


def load_yaml(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"]
    return spec


def container(spec: Doc, name: str) -> Doc:
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        if c["name"] == name:
            return c
    raise KeyError(f"no container {name}")


def set_env(c: Doc, env: dict[str, str]) -> None:
    entries = [e for e in c.get("env", []) if e["name"] not in env]
    entries += [{"name": k, "value": v} for k, v in env.items()]
    c["env"] = entries


def as_test_workload(doc: Doc, agent_env: dict[str, str] | None = None) -> Doc:
    """A Deployment/StatefulSet of deploy/k8s with the test image and agent."""
    spec = pod_spec(doc)
    sidecar = container(spec, "stratad")
    sidecar["image"] = IMAGE
    sidecar["imagePullPolicy"] = "Never"
    agent = container(spec, "agent")
    agent["image"] = IMAGE
    agent["imagePullPolicy"] = "Never"
    agent["command"] = AGENT_COMMAND
    set_env(agent, agent_env or {})
    agent.setdefault("volumeMounts", []).append(
        {"name": AGENT_CONFIGMAP, "mountPath": "/agent", "readOnly": True}
    )
    spec.setdefault("volumes", []).append(
        {"name": AGENT_CONFIGMAP, "configMap": {"name": AGENT_CONFIGMAP}}
    )
    return doc


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value)


def set_toml(text: str, **values: Any) -> str:
    """stratad.toml with these keys set (their line replaced, else appended)."""
    for key, value in values.items():
        line = f"{key} = {toml_value(value)}"
        text, found = re.subn(rf"(?m)^{re.escape(key)}\s*=.*$", line, text)
        if not found:
            text = text.rstrip("\n") + f"\n{line}\n"
    return text


def configmap_with(doc: Doc, **values: Any) -> Doc:
    doc["data"]["stratad.toml"] = set_toml(doc["data"]["stratad.toml"], **values)
    return doc


def agent_configmap() -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": AGENT_CONFIGMAP},
        "data": {"k8s_agent.py": AGENT_SCRIPT.read_text()},
    }


@contextlib.contextmanager
def namespace(cluster: Cluster, name: str, deleting: list[str] | None = None) -> Iterator[str]:
    """A fresh namespace holding the agent's ConfigMap, deleted after. With
    ``deleting``, the deletion is only started and the name appended there (the
    caller waits for it later: pods stop in the background while the next test
    runs); otherwise it is waited for here."""
    cluster.kubectl("create", "namespace", name)
    try:
        # Pods are admitted only once the namespace's default ServiceAccount exists.
        cluster.wait(
            name,
            "the default ServiceAccount",
            lambda: cluster.get(name, "serviceaccount", "default") is not None,
            timeout=60,
            interval=0.25,
        )
        cluster.apply(name, [agent_configmap()])
        yield name
    finally:
        # The pods stop as they would (the agent exits at once on SIGTERM).
        if deleting is None:
            cluster.kubectl(
                "delete", "namespace", name, "--wait=true", "--timeout=180s", timeout=200
            )
        else:
            cluster.kubectl("delete", "namespace", name, "--wait=false")
            deleting.append(name)


def wait_deleted(cluster: Cluster, namespaces: list[str], timeout: float = 180) -> None:
    """Wait until every namespace in ``namespaces`` is gone."""
    deadline = time.monotonic() + timeout
    for name in namespaces:
        remaining = max(1.0, deadline - time.monotonic())
        result = cluster.kubectl(
            "wait", "--for=delete", f"namespace/{name}", f"--timeout={remaining:.0f}s",
            check=False, timeout=remaining + 30,
        )  # fmt: skip
        if result.returncode != 0 and cluster.get("default", "namespace", name) is not None:
            raise AssertionError(
                f"namespace {name} still exists after {timeout:.0f}s:\n"
                f"{result.stdout}{result.stderr}\n{cluster.diagnostics(name)}"
            )


class TcpForwarder:
    """Accept on ``listen_host`` (a free port) and relay each connection to
    ``target``: makes a server bound to 127.0.0.1 on the host (the S3 test
    server) reachable from pods at the node IP."""

    def __init__(self, listen_host: str, target: tuple[str, int]) -> None:
        self.target = target
        self._server = socket.create_server((listen_host, 0))
        self.port = int(self._server.getsockname()[1])
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


# --- the Helm chart ------------------------------------------------------------------


def chart_values(env: list[Doc] | None = None) -> Doc:
    """Values for deploy/helm/stratad: the test image for both containers, the
    agent's command and script volume; nothing else."""
    repository, tag = IMAGE.rsplit(":", 1)
    image = {"repository": repository, "tag": tag, "pullPolicy": "Never"}
    return {
        "stratad": {"image": dict(image)},
        "agent": {
            "image": dict(image),
            "command": AGENT_COMMAND,
            "env": list(env or []),
            "volumeMounts": [{"name": AGENT_CONFIGMAP, "mountPath": "/agent", "readOnly": True}],
            "extraVolumes": [{"name": AGENT_CONFIGMAP, "configMap": {"name": AGENT_CONFIGMAP}}],
        },
    }


def env_list(**env: str) -> list[Doc]:
    return [{"name": k, "value": v} for k, v in env.items()]


def helm_install(
    cluster: Cluster, helm: str, namespace: str, release: str, values: Doc, tmp: Path
) -> str:
    """``helm install RELEASE deploy/helm/stratad -f VALUES`` in ``namespace``."""
    path = tmp / f"{release}-values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = subprocess.run(
        [helm, "install", release, str(CHART), "-n", namespace, "-f", str(path)],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"helm install failed:\n{result.stdout}{result.stderr}"
    return result.stdout
