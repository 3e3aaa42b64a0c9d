#!/usr/bin/env bash
# A Docker engine for `make image`, `make image-test` and `make k8s-test`:
# Debian's docker.io package, with dockerd started by hand when none answers
# (this machine kind has no systemd, and CI machines start with no engine).
#
#   bash scripts/docker/engine.sh          install if missing, start if not running, wait
#   bash scripts/docker/engine.sh stop     stop the dockerd this script started
#
# dockerd keeps its images under /var/lib/docker; its log goes to
# $STRATAD_DOCKERD_LOG (default /var/tmp/stratad-dockerd.log). It uses its own
# managed containerd, separate from the one scripts/k8s/cluster.sh runs for the
# kubelet, so the two never share state.
set -euo pipefail
LOG=${STRATAD_DOCKERD_LOG:-/var/tmp/stratad-dockerd.log}
PIDFILE=/var/run/stratad-dockerd.pid
START_TIMEOUT=${STRATAD_DOCKERD_TIMEOUT:-60}

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

if [ "${1:-start}" = stop ]; then
    if [ -f "$PIDFILE" ]; then
        as_root kill "$(cat "$PIDFILE")" 2>/dev/null || true
        for _ in $(seq 1 30); do
            kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break
            sleep 1
        done
        as_root rm -f "$PIDFILE"
    fi
    exit 0
fi

if ! command -v dockerd >/dev/null; then
    echo "engine.sh: installing Debian's docker.io (dockerd, containerd, runc)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        docker.io iptables >/dev/null
fi

if docker info >/dev/null 2>&1; then
    exit 0
fi

echo "engine.sh: starting dockerd (log: $LOG)"
# setsid: dockerd must outlive the make/pytest process that started it.
as_root setsid dockerd --pidfile "$PIDFILE" >>"$LOG" 2>&1 < /dev/null &
for _ in $(seq 1 "$START_TIMEOUT"); do
    if docker info >/dev/null 2>&1; then
        echo "engine.sh: dockerd $(docker version --format '{{.Server.Version}}') is up" \
             "(storage: $(docker info --format '{{.Driver}}'))"
        exit 0
    fi
    sleep 1
done
echo "engine.sh: dockerd did not answer within ${START_TIMEOUT}s; the end of $LOG:" >&2
tail -n 30 "$LOG" >&2
exit 1
