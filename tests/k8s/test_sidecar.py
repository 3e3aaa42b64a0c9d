"""deploy/k8s/deployment.yaml + configmap.yaml in a real cluster: the native sidecar.

1. stratad (an init container with restartPolicy: Always) is serving before
   the agent container starts: the agent's very first action, a save with no
   wait and no retry, succeeds; the sidecar logged "serving" before the agent
   process started. Its gRPC startup and readiness probes pass (the pod is
   Ready), and the agent reaches it over the unix socket the ConfigMap turns
   on and over 127.0.0.1:50051, each save readable over the other address.
2. An invalid stratad.toml keeps the pod in its init phase: the sidecar
   exits with the config error, Kubernetes restarts it with back-off, the
   agent never starts, and `kubectl logs deploy/agent -c stratad` (what
   docs/deploy.md tells the operator to run) names the bad key. So does the
   sidecar's termination message (terminationMessagePolicy:
   FallbackToLogsOnError), and with it `kubectl describe pod`.
"""

from __future__ import annotations

import re
import tomllib

from kube import (
    K8S_DIR,
    Cluster,
    as_test_workload,
    condition,
    configmap_with,
    container,
    load_yaml,
    parse_time,
    pod_ready,
    pod_spec,
    statuses,
    timestamped,
)

SELECTOR = "app.kubernetes.io/name=agent"
#: What stratad says about the misspelt key in test_invalid_config_keeps_the_agent_from_starting.
BAD_KEY = "config error: unknown key 'grace_periode'"


def plain_manifests() -> tuple[dict, dict, dict]:
    (configmap,) = load_yaml(K8S_DIR / "configmap.yaml")
    (deployment,) = load_yaml(K8S_DIR / "deployment.yaml")
    (policy,) = load_yaml(K8S_DIR / "networkpolicy.yaml")
    return configmap, deployment, policy


def test_native_sidecar_serves_before_the_agent_starts(cluster: Cluster, ns: str) -> None:
    configmap, deployment, policy = plain_manifests()
    config = tomllib.loads(configmap["data"]["stratad.toml"])
    agent_env = {e["name"]: e.get("value") for e in container(pod_spec(deployment), "agent")["env"]}
    # What the manifests promise: the socket is on, and the agent dials it.
    assert config["listen_unix"] == "/var/run/stratad/stratad.sock"
    assert agent_env["STRATAD_ADDRESS"] == "unix:" + config["listen_unix"]
    assert config["listen"] == "0.0.0.0:50051"

    as_test_workload(deployment, {"AGENT_START_COMMAND": "addresses"})
    cluster.apply(ns, [configmap, deployment, policy])
    pod = cluster.wait_pod(ns, SELECTOR, pod_ready, "the agent pod to be Ready")
    name = pod["metadata"]["name"]

    status = statuses(pod)
    sidecar, agent = status["stratad"], status["agent"]
    # Startup probe passed (started), readiness probe passes (ready), both
    # gRPC probes on the health service; nothing restarted.
    spec = container(pod["spec"], "stratad")
    assert spec["restartPolicy"] == "Always"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert spec[probe]["grpc"]["port"] == 50051, spec[probe]
    assert sidecar["started"] is True and sidecar["ready"] is True, sidecar
    assert "running" in sidecar["state"] and sidecar["restartCount"] == 0, sidecar
    assert "running" in agent["state"] and agent["restartCount"] == 0, agent
    assert condition(pod, "Initialized")

    # The agent's first action, a save with no retry, was acknowledged.
    boot = cluster.wait_log(ns, name, "agent", "AGENT-BOOT")
    assert boot["ok"], boot
    assert boot["address"] == "unix:/var/run/stratad/stratad.sock"

    # The sidecar was serving before the agent's process began, and its
    # container started first.
    sidecar_log = timestamped(cluster.logs(ns, name, "stratad", timestamps=True))
    serving = [(t, line) for t, line in sidecar_log if "serving on" in line]
    assert serving, f"no 'serving on' line in the sidecar's log: {sidecar_log}"
    serving_at, serving_line = serving[0]
    assert "unix:/var/run/stratad/stratad.sock" in serving_line, serving_line
    assert serving_at < boot["started_at"], (serving_at, boot)
    sidecar_started = parse_time(sidecar["state"]["running"]["startedAt"])
    agent_started = parse_time(agent["state"]["running"]["startedAt"])
    assert sidecar_started <= agent_started

    # Both addresses serve, and they are the same daemon.
    start = cluster.wait_log(ns, name, "agent", "AGENT-START")
    assert start["ok"], start
    result = start["result"]
    assert result["addresses"] == ["unix:/var/run/stratad/stratad.sock", "127.0.0.1:50051"]
    assert [s["saved_over"] for s in result["saves"]] == result["addresses"]
    for save in result["saves"]:
        assert save["same_bytes"], save
        assert save["loaded_checkpoint_id"] == save["checkpoint_id"], save

    # The metrics port answers in the pod (what the prometheus.io annotations name).
    metrics = cluster.exec_json(
        ns, name, "metrics", {"names": ["stratad_build_info", "grpc_server_handled_total"]}
    )
    assert metrics["status"] == 200
    assert any(line.startswith("stratad_build_info{") for line in metrics["lines"]), metrics
    saves_ok = [
        line
        for line in metrics["lines"]
        if 'grpc_method="SaveState"' in line and 'grpc_code="OK"' in line
    ]
    assert saves_ok and float(saves_ok[0].rsplit(" ", 1)[1]) >= 3, metrics


def test_invalid_config_keeps_the_agent_from_starting(cluster: Cluster, ns: str) -> None:
    configmap, deployment, _ = plain_manifests()
    # A typo in a key: stratad refuses unknown keys at start-up.
    configmap_with(configmap, grace_periode=10)
    as_test_workload(deployment)
    cluster.apply(ns, [configmap, deployment])

    def crash_looping(pod: dict) -> bool:
        sidecar = statuses(pod).get("stratad", {})
        waiting = sidecar.get("state", {}).get("waiting", {})
        return sidecar.get("restartCount", 0) >= 1 and waiting.get("reason") == "CrashLoopBackOff"

    pod = cluster.wait_pod(ns, SELECTOR, crash_looping, "the sidecar to crash-loop")
    name = pod["metadata"]["name"]
    status = statuses(pod)
    sidecar, agent = status["stratad"], status["agent"]
    last = sidecar["lastState"]["terminated"]
    assert last["exitCode"] == 2, last  # stratad's usage/config error exit code
    # The end of the sidecar's log is its termination message (the manifest's
    # terminationMessagePolicy: FallbackToLogsOnError), in the pod's status.
    assert container(pod["spec"], "stratad")["terminationMessagePolicy"] == (
        "FallbackToLogsOnError"
    )
    terminated = [last, sidecar["state"].get("terminated", {})]
    messages = [t.get("message", "") for t in terminated]
    assert any(BAD_KEY in m for m in messages), sidecar
    # The agent never started: still waiting for the init phase to end.
    assert agent["state"].get("waiting", {}).get("reason") == "PodInitializing", agent
    assert not agent.get("started") and not agent.get("lastState"), agent
    assert pod["status"]["phase"] == "Pending"
    assert not condition(pod, "Initialized") and not condition(pod, "Ready")

    # What docs/deploy.md says to run: the logs name the bad key.
    logs = cluster.kubectl("logs", "-n", ns, "deploy/agent", "-c", "stratad").stdout
    assert BAD_KEY in logs, logs
    assert "/etc/stratad/stratad.toml" in logs, logs
    # And `kubectl describe` shows the container restarting, why the pod waits,
    # and (the termination message) the error itself.
    described = cluster.kubectl("describe", "pod", "-n", ns, name).stdout
    assert "CrashLoopBackOff" in described, described
    assert re.search(r"Exit Code:\s+2\n", described), described
    assert BAD_KEY in described, described
