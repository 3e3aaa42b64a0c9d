"""deploy/k8s/statefulset.yaml in a real cluster: shutdown order and sessions
that outlive the pod.

One scenario (module fixture), two kinds of assertions:

- the agent saves sessions; its SIGTERM handler waits a few seconds, then
  saves a final marker, with no retry. The pod is deleted. The sidecar must
  still be serving then: Kubernetes stops a native sidecar only after the main
  container has exited. The sidecar's own log shows the save acknowledged
  before its "SIGTERM received" line, and the marker is on the volume.
- the StatefulSet's new pod, on the same claim, loads every saved checkpoint
  and the marker byte-identical.

Nothing changes in the manifests but the images, the agent, and
log_level = "debug" (one log line per call). The claim binds one of the test
cluster's hostPath PersistentVolumes (StorageClass "standard", the default).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
from kube import (
    K8S_DIR,
    Cluster,
    LogStream,
    as_test_workload,
    configmap_with,
    load_yaml,
    pod_ready,
    statuses,
)

SELECTOR = "app.kubernetes.io/name=agent"
SESSIONS = ["trip-1", "trip-2", "trip-3"]
CHECKPOINTS = 4
FINAL_SESSION = "final-marker"
FINAL_DELAY = 4.0


@pytest.fixture(scope="module")
def scenario(
    cluster: Cluster,
    new_namespace: Callable[[str], AbstractContextManager[str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("statefulset")
    with new_namespace("statefulset") as ns:
        (configmap,) = load_yaml(K8S_DIR / "configmap.yaml")
        service, statefulset = load_yaml(K8S_DIR / "statefulset.yaml")
        configmap_with(configmap, log_level="debug")
        # only_new: the next pod's agent finds the sessions and saves nothing.
        save = {"sessions": SESSIONS, "checkpoints": CHECKPOINTS, "size": 48 * 1024, "only_new": 1}
        as_test_workload(
            statefulset,
            {
                "AGENT_START_COMMAND": "save",
                "AGENT_START_ARGS": json.dumps(save),
                "AGENT_FINAL_SESSION": FINAL_SESSION,
                "AGENT_FINAL_DELAY": str(FINAL_DELAY),
            },
        )
        cluster.apply(ns, [configmap, service, statefulset])

        first = cluster.wait_pod(ns, SELECTOR, pod_ready, "agent-0 to be Ready")
        name = first["metadata"]["name"]
        assert name == "agent-0"
        started = cluster.wait_log(ns, name, "agent", "AGENT-START")
        assert started["ok"], started
        claim_doc = cluster.get(ns, "pvc", "stratad-data-agent-0")
        assert claim_doc["status"]["phase"] == "Bound", claim_doc

        # Follow both containers' logs to their end, then delete the pod.
        streams = {
            c: LogStream(cluster, ns, name, c, tmp / f"{c}.log") for c in ("stratad", "agent")
        }
        cluster.kubectl("delete", "pod", "-n", ns, name, "--wait=false")
        logs = {c: stream.finish(timeout=90) for c, stream in streams.items()}

        old_uid = first["metadata"]["uid"]

        def replaced(pod: dict[str, Any]) -> bool:
            return pod["metadata"]["uid"] != old_uid and pod_ready(pod)

        second = cluster.wait_pod(ns, SELECTOR, replaced, "the new agent-0 to be Ready")
        restarted = cluster.wait_log(ns, "agent-0", "agent", "AGENT-START")
        assert restarted["ok"] and restarted["result"]["skipped"] == SESSIONS, restarted
        loaded = cluster.exec_json(ns, "agent-0", "load", {"sessions": [*SESSIONS, FINAL_SESSION]})
        yield {
            "ns": ns,
            "first": first,
            "second": second,
            "saved": started["result"]["saved"],
            "logs": logs,
            "loaded": loaded,
            "claim": claim_doc,
            "second_claim": cluster.get(ns, "pvc", "stratad-data-agent-0"),
            "tmp": tmp,
        }


def agent_line(logs: list[tuple[float, str]], tag: str) -> dict[str, Any]:
    for _, line in logs:
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1 :])  # type: ignore[no-any-return]
    raise AssertionError(f"no {tag} line in the agent's log: {logs}")


def json_lines(logs: list[tuple[float, str]]) -> list[tuple[float, dict[str, Any]]]:
    out = []
    for at, line in logs:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append((at, entry))
    return out


def test_final_save_lands_before_the_sidecar_stops(scenario: dict[str, Any]) -> None:
    final = agent_line(scenario["logs"]["agent"], "AGENT-FINAL")
    # The agent saved after FINAL_DELAY seconds of its own shutdown, and it was acknowledged.
    assert final["ok"], final
    assert final["save_started_at"] - final["sigterm_at"] >= FINAL_DELAY - 0.1, final

    sidecar = json_lines(scenario["logs"]["stratad"])
    acked = [
        at
        for at, entry in sidecar
        if str(entry.get("method", "")).endswith("/SaveState")
        and entry.get("session") == FINAL_SESSION
        and entry.get("status") == "OK"
    ]
    sigterm = [at for at, entry in sidecar if "SIGTERM received" in entry.get("message", "")]
    stopped = [at for at, entry in sidecar if entry.get("message") == "stratad stopped"]
    where = f"sidecar log: {scenario['tmp'] / 'stratad.log'}"
    assert acked, f"the final save is not in the sidecar's log ({where})"
    assert sigterm, f"the sidecar logged no SIGTERM ({where})"
    assert stopped, f"the sidecar did not stop cleanly ({where})"
    # Kubernetes signalled the sidecar only after the agent had exited: after
    # the final save, which came FINAL_DELAY seconds after the agent's SIGTERM.
    assert acked[0] < sigterm[0] <= stopped[-1], (acked, sigterm, stopped)
    assert sigterm[0] >= final["acked_at"] - 0.05, (sigterm, final)
    assert sigterm[0] - final["sigterm_at"] >= FINAL_DELAY, (sigterm, final)

    # The marker is on the volume: the next pod serves it.
    (marker,) = scenario["loaded"][FINAL_SESSION]["checkpoints"]
    assert marker["checkpoint_id"] == final["checkpoint_id"]
    assert marker["sha256"] == final["sha256"]


def test_sessions_survive_pod_deletion(scenario: dict[str, Any]) -> None:
    first, second = scenario["first"], scenario["second"]
    assert second["metadata"]["name"] == first["metadata"]["name"] == "agent-0"
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    # The same claim, on the same volume.
    assert scenario["second_claim"]["metadata"]["uid"] == scenario["claim"]["metadata"]["uid"]
    assert scenario["second_claim"]["spec"]["volumeName"] == scenario["claim"]["spec"]["volumeName"]
    # The new sidecar recovered the data directory and serves: no restart needed.
    sidecar = statuses(second)["stratad"]
    assert sidecar["ready"] and sidecar["restartCount"] == 0, sidecar

    saved = scenario["saved"]
    assert len(saved) == len(SESSIONS) * CHECKPOINTS
    for session in SESSIONS:
        want = [
            {"checkpoint_id": s["checkpoint_id"], "sha256": s["sha256"], "size": s["size"]}
            for s in saved
            if s["session"] == session
        ]
        got = scenario["loaded"][session]
        assert got.get("checkpoints") == want, (session, got)


def test_operator_sees_every_session(cluster: Cluster, scenario: dict[str, Any]) -> None:
    """`stratad ctl stats` in the new pod's sidecar (docs/deploy.md): everything both pods saved."""
    out = cluster.kubectl(
        "exec", "-n", scenario["ns"], "agent-0", "-c", "stratad", "--",
        "stratad", "ctl", "--address", "unix:/var/run/stratad/stratad.sock", "--json", "stats",
    ).stdout  # fmt: skip
    stats = json.loads(out)
    # The sessions, the marker, and "boot" (each pod's first save: two checkpoints).
    assert stats["sessions"] == len(SESSIONS) + 2, stats
    assert stats["checkpoints"] == len(SESSIONS) * CHECKPOINTS + 1 + 2, stats
