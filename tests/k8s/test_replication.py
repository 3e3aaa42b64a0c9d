"""The scale-out story in a real cluster: sessions that outlive the pod *and* its volume.

The Helm chart with ``replication.mode: sync`` to a real S3 server (SeaweedFS,
scripts/s3-test-server.sh, on the host; pods reach it at the node IP) and the
data directory on an emptyDir, the shape the chart's README recommends. Pod A
takes several checkpoints of several sessions; each is acknowledged only once
it is in object storage. Pod A is deleted, and its emptyDir with it. The
Deployment's next pod B, on an empty volume, serves every acknowledged
checkpoint byte-identical, and resumes a session where A left it (once A's
lease has lapsed).
"""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any

import obstore
from kube import (
    Cluster,
    TcpForwarder,
    chart_values,
    env_list,
    helm_install,
    pod_ready,
)

SESSIONS = ["chat-1", "chat-2", "chat-3"]
CHECKPOINTS = 5
RELEASE = "scale-out"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"


def test_sync_replication_survives_losing_the_pod(
    cluster: Cluster, helm: str, ns: str, tmp_path: Path, node_ip: str, s3_server: Any
) -> None:
    s3_port = urllib.parse.urlsplit(s3_server.endpoint).port
    forwarder = TcpForwarder(node_ip, ("127.0.0.1", s3_port))
    try:
        run_scenario(cluster, helm, ns, tmp_path, s3_server, f"http://{node_ip}:{forwarder.port}")
    finally:
        forwarder.close()


def run_scenario(cluster: Cluster, helm: str, ns: str, tmp: Path, s3: Any, endpoint: str) -> None:
    cluster.apply(
        ns,
        [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "s3-credentials"},
                "stringData": {
                    "AWS_ACCESS_KEY_ID": s3.access_key,
                    "AWS_SECRET_ACCESS_KEY": s3.secret_key,
                },
            }
        ],
    )
    # only_new: pod B's agent finds the sessions (in object storage) and saves nothing.
    save = {"sessions": SESSIONS, "checkpoints": CHECKPOINTS, "size": 64 * 1024, "only_new": True}
    env = env_list(AGENT_START_COMMAND="save", AGENT_START_ARGS=json.dumps(save))
    # Each pod's first save goes to a session of its own (a shared one would
    # be held by the other pod's lease).
    env.append(
        {"name": "AGENT_BOOT_SESSION", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    )
    values = chart_values(env)
    values["replication"] = {
        "mode": "sync",
        "remoteUrl": f"s3://{s3.bucket}/{s3.prefix}",
        "endpoint": endpoint,
        "region": s3.region,
        "allowHttp": True,
        "leaseMs": 3000,
        "credentialsSecret": "s3-credentials",
    }
    helm_install(cluster, helm, ns, RELEASE, values, tmp)

    pod_a = cluster.wait_pod(ns, SELECTOR, pod_ready, "pod A to be Ready")
    name_a = pod_a["metadata"]["name"]
    started = cluster.wait_log(ns, name_a, "agent", "AGENT-START")
    assert started["ok"], started
    acked = started["result"]["saved"]
    assert len(acked) == len(SESSIONS) * CHECKPOINTS

    # Acknowledged means in the bucket: each session's HEAD is there, and
    # pod A's sidecar has nothing left to ship.
    keys = {m["path"] for batch in obstore.list(s3.store()) for m in batch}
    for session in SESSIONS:
        assert f"tenants/default/sessions/{session}/HEAD" in keys, sorted(keys)[:50]
    status = json.loads(
        cluster.kubectl(
            "exec", "-n", ns, name_a, "-c", "stratad", "--", "stratad", "ctl",
            "--address", "unix:/var/run/stratad/stratad.sock", "--json", "replication", "status",
        ).stdout
    )  # fmt: skip
    assert status["mode"] == "sync" and status["node_id"] == name_a, status
    assert status["sessions_owned"] >= len(SESSIONS), status
    assert status["bytes_behind"] == 0 and status["objects_queued"] == 0, status

    # Lose pod A and its emptyDir; the Deployment starts pod B on a new, empty one.
    cluster.kubectl("delete", "pod", "-n", ns, name_a, "--wait=false")
    pod_b = cluster.wait_pod(ns, SELECTOR, pod_ready, "pod B to be Ready", exclude=(name_a,))
    name_b = pod_b["metadata"]["name"]
    cluster.wait_gone(ns, "pod", name_a)
    assert name_b != name_a
    restarted = cluster.wait_log(ns, name_b, "agent", "AGENT-START")
    assert restarted["ok"] and restarted["result"]["skipped"] == SESSIONS, restarted

    loaded = cluster.exec_json(ns, name_b, "load", {"sessions": SESSIONS})
    for session in SESSIONS:
        want = [
            {"checkpoint_id": a["checkpoint_id"], "sha256": a["sha256"], "size": a["size"]}
            for a in acked
            if a["session"] == session
        ]
        assert loaded[session].get("checkpoints") == want, (session, loaded[session])

    # Pod B carries on where A stopped: the next save extends the same history.
    resumed = cluster.exec_json(
        ns, name_b, "resume", {"session": SESSIONS[0], "step": CHECKPOINTS, "size": 64 * 1024}
    )
    assert resumed["head"] == resumed["checkpoint_id"], resumed
    after = cluster.exec_json(ns, name_b, "load", {"sessions": SESSIONS[:1]})[SESSIONS[0]]
    ids = [c["checkpoint_id"] for c in after["checkpoints"]]
    first_session = [a["checkpoint_id"] for a in acked if a["session"] == SESSIONS[0]]
    assert ids == [*first_session, resumed["checkpoint_id"]], after
