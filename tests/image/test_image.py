"""The container image, run for real (``make image-test``; docs/deploy.md).

``make image`` builds deploy/Dockerfile into ``stratad:dev``; these tests run it
in a real Docker engine the way Kubernetes' restricted pod security does
(read-only root filesystem, every capability dropped, no new privileges) and
check from the outside what docs/deploy.md promises: it runs as UID/GID 10001;
a state saved through the SDK lands on the data volume and a new container on
that volume loads it; gRPC health and /metrics answer on published ports; the
image's own HEALTHCHECK turns the container healthy; a second container (no
network at all) reaches the daemon through its unix socket in a shared volume;
``docker stop`` (SIGTERM) ends it with exit code 0 long before the kill
timeout; a bad configuration stops it at once, non-zero, with a message in
``docker logs`` that names the problem. The image's size is printed at the end
of the run (conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from grpc_health.v1 import health_pb2
from imagekit import METRICS_PORT, Container, health_status

import stratad

ROOT = Path(__file__).resolve().parents[2]
DATA = "/var/lib/stratad"
SOCKET_DIR = "/var/run/stratad"
UID = 10001
# The image is ~195 MB (docs/deploy.md says what fills it); a jump past this
# means something heavy slipped in (a compiler, a second Python, pip caches).
MAX_IMAGE_BYTES = 250_000_000
VERSION = re.search(r'^version = "(.+)"$', (ROOT / "Cargo.toml").read_text(), re.M)[1]  # type: ignore[index]

Docker = Callable[..., CompletedProcess[str]]
RunContainer = Callable[..., Container]


def proc_status(container: Container) -> dict[str, str]:
    """/proc/1/status of the container's main process (the daemon), as a dict."""
    result = container.exec("cat", "/proc/1/status")
    assert result.returncode == 0, result.stderr
    return dict(line.split(":\t", 1) for line in result.stdout.splitlines() if ":\t" in line)


def test_the_image_declares_user_ports_volume_healthcheck_and_entrypoint(
    docker: Docker, image: str
) -> None:
    cfg = json.loads(docker("image", "inspect", "-f", "{{json .Config}}", image).stdout)
    assert cfg["User"] == f"{UID}:{UID}"
    assert {"50051/tcp", "9464/tcp"} <= set(cfg["ExposedPorts"])
    assert DATA in cfg["Volumes"]
    assert cfg["Healthcheck"]["Test"] == [
        "CMD", "stratad", "ctl", "--address", "127.0.0.1:50051", "health",
    ]  # fmt: skip
    assert cfg["Entrypoint"] == ["stratad"] and cfg["Cmd"] == ["serve"]
    # image.sh labels what it builds with Cargo.toml's version.
    assert (cfg["Labels"] or {}).get("org.opencontainers.image.version") == VERSION, cfg["Labels"]
    # make image tags the same image with the version (the k8s tests load stratad:dev).
    if image == "stratad:dev":
        ids = {
            docker("image", "inspect", "-f", "{{.Id}}", t).stdout
            for t in (image, f"stratad:{VERSION}")
        }
        assert len(ids) == 1, f"stratad:dev and stratad:{VERSION} differ"
    size = int(docker("image", "inspect", "-f", "{{.Size}}", image).stdout)
    print(f"{image}: {size / 1e6:.0f} MB")
    assert size < MAX_IMAGE_BYTES, f"{image} is {size / 1e6:.0f} MB"


def test_runs_as_10001_on_a_read_only_root_with_no_capabilities(
    run_container: RunContainer, volume: Callable[[], str], docker: Docker
) -> None:
    container = run_container(volumes={volume(): DATA})
    container.wait_serving()
    status = proc_status(container)
    # real, effective, saved and filesystem IDs alike
    assert status["Uid"].split() == [str(UID)] * 4, status["Uid"]
    assert status["Gid"].split() == [str(UID)] * 4, status["Gid"]
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0, status
    assert status["NoNewPrivs"].strip() == "1"
    assert container.inspect()["HostConfig"]["ReadonlyRootfs"] is True
    # Nothing outside the volumes is writable, the install prefix included ...
    for path in ("/opt/stratad/probe", "/tmp/probe", "/etc/stratad/probe"):
        denied = container.exec("touch", path)
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr, (path, denied)
    # ... and the daemon wrote nothing there while starting and serving.
    assert docker("diff", container.name).stdout == ""


def test_a_save_lands_on_the_volume_and_a_new_container_loads_it(
    run_container: RunContainer, volume: Callable[[], str], docker: Docker, image: str
) -> None:
    data = volume()
    first = run_container(volumes={data: DATA})
    target = first.wait_serving()
    payload = b'{"messages": ["kept across containers"]}' * 100
    with stratad.Client(target) as client:
        client.create_session("image-volume", keep_last=10)
        saved = client.save_state("image-volume", payload, content_type="application/json")
    code, _ = first.stop()
    assert code == 0, first.logs()
    # The store is on the volume, owned by the daemon's user (listed from a
    # throwaway container: the volume's host path is the engine's business).
    listing = docker(
        "run", "--rm", "--read-only", "--network", "none", "-v", f"{data}:/v:ro",
        "--entrypoint", "find", image, "/v", "-type", "f", "-printf", "%U %p\n",
    ).stdout.split("\n")  # fmt: skip
    files = [line for line in listing if line]
    assert files, "nothing on the data volume"
    assert all(line.startswith(f"{UID} ") for line in files), files[:5]

    second = run_container(volumes={data: DATA})
    with stratad.Client(second.wait_serving()) as client:
        loaded = client.load_state("image-volume")
    assert loaded.data == payload
    assert loaded.digest == saved.digest
    assert loaded.checkpoint_id == saved.checkpoint_id


def test_grpc_health_and_metrics_answer_on_published_ports(
    run_container: RunContainer, volume: Callable[[], str]
) -> None:
    container = run_container(volumes={volume(): DATA})
    target = container.wait_serving()
    assert health_status(target) == health_pb2.HealthCheckResponse.SERVING
    with stratad.Client(target) as client:
        client.create_session("image-metrics")
    url = f"http://{container.address(METRICS_PORT)}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    assert f'stratad_build_info{{version="{VERSION}"}} 1.0' in text, text[:2000]
    assert re.search(r'grpc_server_handled_total\{[^}]*grpc_method="CreateSession"', text), (
        "the CreateSession call is not counted"
    )


def test_the_image_healthcheck_turns_the_container_healthy(
    run_container: RunContainer, volume: Callable[[], str]
) -> None:
    container = run_container(volumes={volume(): DATA}, publish=False)
    # The image's own timing: first check after --interval (10 s).
    deadline = time.monotonic() + 60
    health: dict[str, object] = {}
    while time.monotonic() < deadline:
        state = container.state
        assert state["Running"], container.logs()
        health = state["Health"]
        if health["Status"] == "healthy":
            break
        time.sleep(0.5)
    assert health.get("Status") == "healthy", (health, container.logs())
    last = health["Log"][-1]  # type: ignore[index]
    assert last["ExitCode"] == 0 and "SERVING" in last["Output"], last


def test_a_second_container_reaches_the_daemon_through_the_unix_socket(
    run_container: RunContainer, volume: Callable[[], str]
) -> None:
    sockets = volume()
    daemon = run_container(
        volumes={volume(): DATA, sockets: SOCKET_DIR},
        env={"STRATAD_LISTEN_UNIX": f"{SOCKET_DIR}/stratad.sock"},
    )
    target = daemon.wait_serving()
    # The same image as the agent: its Python and SDK, no network at all, so
    # the socket in the shared volume is the only way to the daemon.
    code = (
        "import stratad\n"
        f"with stratad.Client('unix:{SOCKET_DIR}/stratad.sock') as c:\n"
        "    c.create_session('over-the-socket')\n"
        "    saved = c.save_state('over-the-socket', b'via unix socket')\n"
        "    assert c.load_state('over-the-socket').data == b'via unix socket'\n"
        "print('socket ok', saved.digest)\n"
    )
    agent = run_container(
        "-c", code,
        volumes={sockets: SOCKET_DIR}, publish=False,
        extra=("--network", "none", "--entrypoint", "/opt/stratad/bin/python"),
    )  # fmt: skip
    assert agent.wait_exit(timeout=60) == 0, agent.logs()
    logs = agent.logs()
    assert "socket ok" in logs, logs
    digest = logs.split("socket ok", 1)[1].split()[0]
    # The same daemon, over TCP from the host, has what came through the socket.
    with stratad.Client(target) as client:
        loaded = client.load_state("over-the-socket")
    assert loaded.data == b"via unix socket" and loaded.digest == digest


def test_docker_stop_sigterm_exits_0_quickly(
    run_container: RunContainer, volume: Callable[[], str]
) -> None:
    container = run_container(volumes={volume(): DATA})
    with stratad.Client(container.wait_serving()) as client:
        client.create_session("image-stop")
        client.save_state("image-stop", b"last words")
    code, took = container.stop(timeout=30)
    logs = container.logs()
    # 137 would be docker's SIGKILL at the end of the 30 s timeout.
    assert code == 0, logs
    assert took < 10, f"docker stop took {took:.1f}s"
    assert container.state["OOMKilled"] is False
    assert "SIGTERM received" in logs and "stratad stopped" in logs, logs


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("config-file", "unknown key 'lissten'"),
        ("environment", "invalid value for listen (environment STRATAD_LISTEN)"),
    ],
    ids=["config-file", "environment"],
)
def test_a_bad_configuration_exits_non_zero_with_a_readable_message(
    run_container: RunContainer, volume: Callable[[], str], tmp_path: Path, how: str, expected: str
) -> None:
    if how == "config-file":
        # As a Kubernetes ConfigMap does: a directory mounted on /etc/stratad.
        config_dir = tmp_path / "etc-stratad"
        config_dir.mkdir()
        shipped = (ROOT / "deploy/docker/stratad.toml").read_text()
        (config_dir / "stratad.toml").write_text(shipped + 'lissten = "0.0.0.0:50052"\n')
        config_dir.chmod(0o755)  # the daemon's UID reads it
        (config_dir / "stratad.toml").chmod(0o644)
        container = run_container(
            volumes={volume(): DATA, str(config_dir): "/etc/stratad:ro"}, publish=False
        )
    else:
        container = run_container(
            volumes={volume(): DATA}, env={"STRATAD_LISTEN": "nonsense"}, publish=False
        )
    code = container.wait_exit(timeout=60)
    logs = container.logs()
    assert code != 0, logs
    assert expected in logs, logs
    assert "Traceback" not in logs, logs


def test_the_extra_ca_certificates_are_in_the_images_trust_store(
    docker: Docker, image: str
) -> None:
    # make image passes this machine's extra roots (scripts/docker/image.sh).
    ca_dir = os.environ.get("STRATAD_EXTRA_CA_DIR", "/usr/local/share/ca-certificates")
    certs = sorted(Path(ca_dir).rglob("*.crt")) if ca_dir and Path(ca_dir).is_dir() else []
    if not certs:
        pytest.skip(f"no extra CA certificates in {ca_dir!r}: the build had none to add")
    bundle = docker(
        "run", "--rm", "--read-only", "--network", "none", "--entrypoint", "cat", image,
        "/etc/ssl/certs/ca-certificates.crt",
    ).stdout.replace("\n", "")  # fmt: skip
    pem = re.compile(r"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.S)
    for cert in certs:
        for body in pem.findall(cert.read_text()):
            assert body.replace("\n", "") in bundle, f"{cert} is not in the image's CA bundle"
