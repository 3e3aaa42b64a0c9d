#!/usr/bin/env bash
# A real S3-compatible server for tests: SeaweedFS, built from the Go module
# proxy at a pinned version and cached in .tools/bin/weed ($STRATAD_TOOLS_DIR/bin/weed).
#
#   scripts/s3-test-server.sh build              build .tools/bin/weed (skipped when it
#                                                already reports the pinned version)
#   scripts/s3-test-server.sh start DIR PORT     start `weed mini` in the background, S3 on
#                                                127.0.0.1:PORT, data in DIR, bucket stratad-test;
#                                                return once a signed write works; print
#                                                endpoint=, pid=, bucket=; pid in DIR/weed.pid
#   scripts/s3-test-server.sh stop DIR           stop the server started with DIR
#
# `start` also listens on PORT+1 .. PORT+9 (master, volume and filer HTTP, the
# gRPC ports of master, volume, filer and S3, admin HTTP and gRPC), so pick
# PORT with ten free ports from it. Credentials (signed requests, region
# us-east-1): access key stratad-test, secret stratad-test-secret. `start`
# needs curl 7.75 or later (--aws-sigv4).
#
# Build needs only `go` (PATH or /usr/local/go/bin) and the Go module proxy:
# `go mod download` fetches the pinned module, the build fetches its
# dependencies, and when the installed Go is older than the module's `go` line
# GOTOOLCHAIN=auto fetches the required toolchain from the proxy too (set
# GOTOOLCHAIN=local to forbid that). The first build takes a few minutes; Go's
# build cache makes a rebuild quick.
set -euo pipefail
# shellcheck source=lib/go.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/go.sh"

SEAWEEDFS_MODULE=github.com/seaweedfs/seaweedfs
# Bump deliberately: `go mod download -json github.com/seaweedfs/seaweedfs@latest`.
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6

BUCKET=stratad-test
ACCESS_KEY=stratad-test
SECRET_KEY=stratad-test-secret
REGION=us-east-1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=${STRATAD_TOOLS_DIR:-$ROOT/.tools}  # as scripts/check_deploy.sh
WEED=$TOOLS/bin/weed

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
}

# True when PID is a running weed (a pid file may outlive its process, and
# the pid be reused).
is_weed() {
    kill -0 "$1" 2>/dev/null && [[ $(ps -o comm= -p "$1") == weed ]]
}

# True when .tools/bin/weed exists and was built from the pinned version.
weed_is_current() {
    [[ -x $WEED ]] && "$WEED" version 2>/dev/null | grep -qF -- "$SEAWEEDFS_VERSION"
}

cmd_build() {
    if weed_is_current; then
        echo "weed $SEAWEEDFS_VERSION is built: $WEED"
        return
    fi
    local go
    go=$(find_go)
    # Not -mod=readonly: the module is built outside its own repository. No VCS
    # stamping: the copy lives inside this repository's work tree.
    export GOFLAGS="-mod=mod -buildvcs=false"
    export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
    mkdir -p "$TOOLS/bin" "$TOOLS/src"

    echo "downloading $SEAWEEDFS_MODULE@$SEAWEEDFS_VERSION"
    local info moddir
    # Outside any module, so that no go.mod around us is consulted or changed.
    info=$(cd "$TOOLS" && "$go" mod download -json "$SEAWEEDFS_MODULE@$SEAWEEDFS_VERSION") ||
        die "go mod download failed: $info"
    moddir=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
    [[ -n $moddir && -f $moddir/go.mod ]] || die "no module directory in: $info"

    # The module cache is read-only; build in a writable copy.
    local src=$TOOLS/src/seaweedfs-$SEAWEEDFS_VERSION
    rm -rf "$src"
    cp -R "$moddir" "$src"
    chmod -R u+w "$src"

    echo "building weed with $("$go" version) (a few minutes the first time)"
    local start=$SECONDS
    (cd "$src" && "$go" build -trimpath \
        -ldflags "-s -w -X $SEAWEEDFS_MODULE/weed/util/version.COMMIT=$SEAWEEDFS_VERSION" \
        -o "$WEED.tmp" ./weed)
    mv -f "$WEED.tmp" "$WEED"
    rm -rf "$src"
    weed_is_current || die "$WEED does not report $SEAWEEDFS_VERSION: $("$WEED" version 2>&1)"
    echo "built $WEED in $((SECONDS - start))s: $("$WEED" version 2>/dev/null | head -n 1)"
}

s3_config() {
    cat <<EOF
{
  "identities": [
    {
      "name": "stratad-test",
      "credentials": [{"accessKey": "$ACCESS_KEY", "secretKey": "$SECRET_KEY"}],
      "actions": ["Admin", "Read", "List", "Tagging", "Write"]
    }
  ]
}
EOF
}

# One signed S3 request (curl's SigV4); prints the HTTP status, 000 when
# there was no answer.
s3_request() {  # METHOD PATH [curl args...]
    local method=$1 path=$2
    shift 2
    curl -s -o /dev/null -w '%{http_code}' --max-time 30 \
        --aws-sigv4 "aws:amz:$REGION:s3" --user "$ACCESS_KEY:$SECRET_KEY" \
        -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' \
        -X "$method" "$@" "$ENDPOINT$path" 2>/dev/null || true
}

# Repeat a signed request until it gets the expected status; give up (and
# stop weed) when weed exits or the start deadline passes.
await_s3() {  # WHAT STATUS METHOD PATH [curl args...]
    local what=$1 want=$2 status
    shift 2
    while :; do
        status=$(s3_request "$@")
        [[ $status == "$want" ]] && return
        if ! kill -0 "$PID" 2>/dev/null; then
            tail -n 50 "$DIR/weed.log" >&2
            rm -f "$DIR/weed.pid"
            die "weed exited before $what (log: $DIR/weed.log)"
        fi
        if ((SECONDS > DEADLINE)); then
            tail -n 50 "$DIR/weed.log" >&2
            cmd_stop "$DIR" >/dev/null
            die "no $what within ${START_TIMEOUT}s: last HTTP status $status (log: $DIR/weed.log)"
        fi
        sleep 0.2
    done
}

cmd_start() {
    [[ $# -eq 2 ]] || usage
    local port=$2
    if ! [[ $port =~ ^[0-9]+$ ]] || ((port < 1024 || port + 9 > 65535)); then
        die "PORT must be a number in 1024..65526, got '$port'"
    fi
    [[ -x $WEED ]] || die "$WEED is missing: run '$0 build' first"
    weed_is_current || echo "s3-test-server: warning: $WEED is not $SEAWEEDFS_VERSION; '$0 build' rebuilds it" >&2
    command -v curl >/dev/null || die "start needs curl (7.75 or later, for --aws-sigv4)"
    mkdir -p "$1"
    DIR=$(cd "$1" && pwd)
    if [[ -f $DIR/weed.pid ]] && is_weed "$(cat "$DIR/weed.pid")"; then
        die "already running with pid $(cat "$DIR/weed.pid") (stop it first: $0 stop $DIR)"
    fi
    mkdir -p "$DIR/data"
    s3_config >"$DIR/s3.json"

    # `weed mini`: master, volume server, filer and S3 gateway in one process,
    # tuned for small local use (it starts and stops faster than `weed server`).
    # Every listener on 127.0.0.1 and on a port derived from PORT, so servers
    # started side by side do not clash.
    local args=(
        mini
        -dir="$DIR/data"
        -ip=127.0.0.1 -ip.bind=127.0.0.1
        -s3.port="$port" -s3.port.grpc="$((port + 7))"
        -s3.config="$DIR/s3.json"
        -bucket="$BUCKET"
        -master.port="$((port + 1))" -master.port.grpc="$((port + 4))"
        -volume.port="$((port + 2))" -volume.port.grpc="$((port + 5))"
        -filer.port="$((port + 3))" -filer.port.grpc="$((port + 6))"
        -admin.port="$((port + 8))" -admin.port.grpc="$((port + 9))"
        -admin.port.legacy=0 -admin.ui=false
        # Not needed: WebDAV, Iceberg and Lance endpoints (fixed default ports).
        -webdav=false -s3.port.iceberg=0 -s3.port.lance=0
        # Volumes are sparse files; a fixed limit keeps mini from sizing them
        # from the free disk space. No pause before stopping, no telemetry.
        -master.volumeSizeLimitMB=64 -volume.preStopSeconds=0 -master.telemetry=false
    )
    printf '%q ' "$WEED" "${args[@]}" >"$DIR/weed.cmdline"
    echo >>"$DIR/weed.cmdline"
    echo "$port" >"$DIR/weed.port"

    local start=$SECONDS
    # In the caller's process group: a Ctrl-C of the test run ends it too.
    "$WEED" "${args[@]}" </dev/null >"$DIR/weed.log" 2>&1 &
    PID=$!
    echo "$PID" >"$DIR/weed.pid"

    # Ready when a signed write goes through: the gateway answers, the
    # credentials work, the bucket exists, and the cluster can allocate a
    # volume and take an object write lock (a fresh cluster holds both back
    # for a few seconds). The probe object is deleted again.
    ENDPOINT=http://127.0.0.1:$port
    START_TIMEOUT=${S3_TEST_SERVER_START_TIMEOUT:-60}
    DEADLINE=$((SECONDS + START_TIMEOUT))
    local probe=/$BUCKET/.s3-test-server-probe
    await_s3 "signed ListBuckets" 200 GET /
    await_s3 "probe write" 200 PUT "$probe" --data-binary ready
    await_s3 "probe delete" 204 DELETE "$probe"

    echo "endpoint=$ENDPOINT"
    echo "pid=$PID"
    echo "bucket=$BUCKET"
    echo "started in $((SECONDS - start))s" >&2
}

cmd_stop() {
    [[ $# -eq 1 ]] || usage
    local dir=$1 pidfile=$1/weed.pid pid
    if [[ ! -f $pidfile ]]; then
        echo "not running (no $pidfile)"
        return
    fi
    pid=$(cat "$pidfile")
    if is_weed "$pid"; then
        kill -TERM "$pid"
        local i
        for ((i = 0; i < 100; i++)); do # 10 s to stop gracefully
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$pidfile"
    # weed's in-process sockets are in /tmp, named by port (a unix socket path
    # must be short, so not in DIR); a killed weed leaves them behind.
    if [[ -f $dir/weed.port ]]; then
        local port socket
        port=$(cat "$dir/weed.port")
        for socket in s3-$port filer-$((port + 3)) master-grpc-$((port + 4)) \
            volume-grpc-$((port + 5)) filer-grpc-$((port + 6)) s3-grpc-$((port + 7)) \
            admin-grpc-$((port + 9)); do
            rm -f "/tmp/seaweedfs-$socket.sock"
        done
    fi
    echo "stopped pid $pid"
}

case ${1:-} in
build)
    [[ $# -eq 1 ]] || usage
    cmd_build
    ;;
start | stop)
    cmd=cmd_$1
    shift
    "$cmd" "$@"
    ;;
*) usage ;;
esac
