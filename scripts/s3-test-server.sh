#!/usr/bin/env bash
# A real S3-compatible server for tests: SeaweedFS, built from the Go module
# proxy at a pinned version and cached in .tools/bin/weed.
#
#   scripts/s3-test-server.sh build              build .tools/bin/weed (skipped when it
#                                                already reports the pinned version)
#   scripts/s3-test-server.sh start DIR PORT     start S3 on 127.0.0.1:PORT with data in DIR,
#                                                in the background; create bucket stratad-test;
#                                                print endpoint=... and pid=...; pid in DIR/weed.pid
#   scripts/s3-test-server.sh stop DIR           stop the server started with DIR
#
# `start` also uses the ports PORT+1 .. PORT+7 (master, volume and filer HTTP,
# then the gRPC ports of master, volume, filer and S3), so pick PORT with eight
# free ports from it. Credentials (signed requests, region us-east-1):
# access key stratad-test, secret stratad-test-secret.
#
# Build needs only `go` (PATH or /usr/local/go/bin) and the Go module proxy:
# `go mod download` fetches the pinned module, the build fetches its
# dependencies, and when the installed Go is older than the module's `go` line
# GOTOOLCHAIN=auto fetches the required toolchain from the proxy too (set
# GOTOOLCHAIN=local to forbid that). The first build takes a few minutes; Go's
# build cache makes a rebuild quick.
set -euo pipefail

SEAWEEDFS_MODULE=github.com/seaweedfs/seaweedfs
# Bump deliberately: `go mod download -json github.com/seaweedfs/seaweedfs@latest`.
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6

BUCKET=stratad-test
ACCESS_KEY=stratad-test
SECRET_KEY=stratad-test-secret

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=$ROOT/.tools
WEED=$TOOLS/bin/weed

die() {
    printf 's3-test-server: %s\n' "$*" >&2
    exit 1
}

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
}

find_go() {
    if command -v go >/dev/null 2>&1; then
        command -v go
    elif [[ -x /usr/local/go/bin/go ]]; then
        echo /usr/local/go/bin/go
    else
        die "no Go toolchain: put go on PATH (or install it in /usr/local/go)"
    fi
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
    echo "built $WEED in $((SECONDS - start))s: $("$WEED" version | head -n 1)"
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

cmd_start() {
    [[ $# -eq 2 ]] || usage
    local dir=$1 port=$2
    if ! [[ $port =~ ^[0-9]+$ ]] || ((port < 1024 || port + 7 > 65535)); then
        die "PORT must be a number in 1024..65528, got '$port'"
    fi
    [[ -x $WEED ]] || die "$WEED is missing: run '$0 build' first"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [[ -f $dir/weed.pid ]] && kill -0 "$(cat "$dir/weed.pid")" 2>/dev/null; then
        die "already running with pid $(cat "$dir/weed.pid") (stop it first: $0 stop $dir)"
    fi
    mkdir -p "$dir/data"
    s3_config >"$dir/s3.json"

    local endpoint=http://127.0.0.1:$port
    local args=(
        server
        -ip=127.0.0.1 -ip.bind=127.0.0.1
        -dir="$dir/data"
        # Small volumes, few of them: a test writes kilobytes.
        -master.volumeSizeLimitMB=16 -volume.max=8
        -master.port="$((port + 1))" -master.port.grpc="$((port + 4))"
        -volume.port="$((port + 2))" -volume.port.grpc="$((port + 5))"
        -volume.preStopSeconds=0
        -filer -filer.port="$((port + 3))" -filer.port.grpc="$((port + 6))"
        -filer.localSocket="$dir/filer.sock"
        -s3 -s3.port="$port" -s3.port.grpc="$((port + 7))"
        -s3.config="$dir/s3.json"
        -s3.localSocket="$dir/s3.sock"
        # No extra listeners on fixed ports, no phoning home.
        -s3.port.iceberg=0 -s3.port.lance=0
        -master.telemetry=false
    )
    printf '%q ' "$WEED" "${args[@]}" >"$dir/weed.cmdline"
    echo >>"$dir/weed.cmdline"
    echo "$port" >"$dir/weed.port"

    local start=$SECONDS
    # In the caller's process group: a Ctrl-C of the test run ends it too.
    "$WEED" "${args[@]}" </dev/null >"$dir/weed.log" 2>&1 &
    local pid=$!
    echo "$pid" >"$dir/weed.pid"

    # Ready when a signed-request endpoint answers: an anonymous ListBuckets
    # gets an S3 error document (403) once the gateway is serving.
    local deadline=$((SECONDS + ${S3_TEST_SERVER_START_TIMEOUT:-60}))
    until curl -s -o /dev/null -w '%{http_code}' "$endpoint/" 2>/dev/null | grep -q '^[1-5]'; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 50 "$dir/weed.log" >&2
            rm -f "$dir/weed.pid"
            die "weed exited before S3 answered on $endpoint (log: $dir/weed.log)"
        fi
        if ((SECONDS > deadline)); then
            tail -n 50 "$dir/weed.log" >&2
            cmd_stop "$dir" >/dev/null
            die "S3 did not answer on $endpoint within ${S3_TEST_SERVER_START_TIMEOUT:-60}s (log: $dir/weed.log)"
        fi
        sleep 0.2
    done

    create_bucket "$dir" "$port" "$pid"
    echo "endpoint=$endpoint"
    echo "pid=$pid"
    echo "bucket=$BUCKET"
    echo "started in $((SECONDS - start))s" >&2
}

# A bucket is a directory under /buckets in the filer (what `weed shell`'s
# s3.bucket.create makes too); S3 serves it at once. 201 created, 409 exists
# (a restart on old data).
create_bucket() {
    local dir=$1 port=$2 pid=$3
    local url=http://127.0.0.1:$((port + 3))/buckets/$BUCKET/
    local deadline=$((SECONDS + 30)) status
    while :; do
        status=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$url" 2>/dev/null) || true
        [[ $status == 201 || $status == 409 ]] && return
        if ! kill -0 "$pid" 2>/dev/null || ((SECONDS > deadline)); then
            tail -n 50 "$dir/weed.log" >&2
            cmd_stop "$dir" >/dev/null
            die "could not create bucket $BUCKET through the filer at $url (HTTP $status)"
        fi
        sleep 0.2
    done
}

cmd_stop() {
    [[ $# -eq 1 ]] || usage
    local dir=$1 pidfile=$1/weed.pid pid
    if [[ ! -f $pidfile ]]; then
        echo "not running (no $pidfile)"
        return
    fi
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        local i
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$pidfile"
    # weed puts its in-process gRPC sockets in /tmp, named by port.
    if [[ -f $dir/weed.port ]]; then
        local port p
        port=$(cat "$dir/weed.port")
        for p in master:4 volume:5 filer:6 s3:7; do
            rm -f "/tmp/seaweedfs-${p%%:*}-grpc-$((port + ${p#*:})).sock"
        done
    fi
    echo "stopped pid $pid"
}

case ${1:-} in
build) shift && [[ $# -eq 0 ]] || usage && cmd_build ;;
start) shift && cmd_start "$@" ;;
stop) shift && cmd_stop "$@" ;;
*) usage ;;
esac
