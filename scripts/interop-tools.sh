#!/usr/bin/env bash
# The gRPC interop tools the tests in tests/interop use, built from the Go
# module proxy at one pinned grpc-go version and cached (idempotent: built once
# per version, ours again only when their source changes):
#
#   client          google.golang.org/grpc/interop/client, grpc-go's official interop client
#   server          google.golang.org/grpc/interop/server, grpc-go's interop server (a reference)
#   compression     tests/interop/compression: the spec's four compression cases, which
#                   grpc-go's client does not implement ("Unsupported test case")
#   test_service.pb a serialized google.protobuf.FileDescriptorSet of grpc/testing/test.proto
#                   and its imports (messages.proto, empty.proto), written by
#                   tests/interop/descriptors from the descriptors grpc-go registers
#
#   scripts/interop-tools.sh build   build what is missing; print NAME=PATH lines
#   scripts/interop-tools.sh paths   print the NAME=PATH lines (no build)
#
# Everything goes to $STRATAD_GO_TOOLS_DIR/interop-<version>, by default
# $HOME/.cache/stratad-tools/interop-<version> (as scripts/go-tools.sh), which
# survives fresh clones on the same machine. Needs only `go` (PATH or
# /usr/local/go/bin); module downloads and build outputs use Go's own caches
# (GOMODCACHE, GOCACHE). A cold build (empty Go caches) took 3m20s on a busy
# 2-core machine, mostly the client; with warm Go caches, about 10s.
set -euo pipefail
# shellcheck source=lib/go.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/go.sh"

# Bump deliberately (`go list -m -json google.golang.org/grpc@latest`); our two
# Go programs are built against it too (their go.mod is rewritten to it).
GRPC_GO_VERSION=v1.85.0

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=${STRATAD_GO_TOOLS_DIR:-$HOME/.cache/stratad-tools}
DIR=$TOOLS/interop-$GRPC_GO_VERSION
BIN=$DIR/bin
DESCRIPTOR_SET=$DIR/test_service.pb
INSTALL_TIMEOUT=${INSTALL_TIMEOUT:-1500}

go_env() {
    export GOFLAGS="-modcacherw -buildvcs=false"
    export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
}

# go install PACKAGE@GRPC_GO_VERSION into $BIN unless its stamp says it is there.
grpc_command() {  # name package
    local name=$1 package=$2@$GRPC_GO_VERSION stamp=$BIN/.$1.version
    if [[ -x $BIN/$name && "$(cat "$stamp" 2>/dev/null)" == "$package" ]]; then
        return
    fi
    local go start=$SECONDS
    go=$(find_go)
    echo "interop-tools: go install $package" >&2
    # Outside any module, so that no go.mod around us is consulted or changed.
    (cd "$DIR" && GOBIN=$BIN timeout "$INSTALL_TIMEOUT" "$go" install -trimpath "$package") ||
        die "go install $package failed"
    echo "$package" >"$stamp"
    echo "interop-tools: $name built in $((SECONDS - start))s" >&2
}

# Build tests/interop/NAME (a main package with its own go.mod) into $BIN/NAME
# against GRPC_GO_VERSION, in a throwaway copy of the module (its go.mod is
# rewritten there, never in the work tree).
our_command() {  # name
    local name=$1 source=$ROOT/tests/interop/$1 stamp=$BIN/.$1.version digest
    digest=$(cd "$source" && cat go.mod go.sum ./*.go | sha256sum | cut -d' ' -f1)
    digest="$GRPC_GO_VERSION $digest"
    if [[ -x $BIN/$name && "$(cat "$stamp" 2>/dev/null)" == "$digest" ]]; then
        return
    fi
    local go start=$SECONDS work=$DIR/src/$name
    go=$(find_go)
    echo "interop-tools: building $name (tests/interop/$name) with grpc-go $GRPC_GO_VERSION" >&2
    rm -rf "$work"
    mkdir -p "$work"
    cp "$source"/go.mod "$source"/go.sum "$source"/*.go "$work"/
    (
        cd "$work"
        "$go" mod edit -require="google.golang.org/grpc@$GRPC_GO_VERSION"
        timeout "$INSTALL_TIMEOUT" "$go" mod tidy
        timeout "$INSTALL_TIMEOUT" "$go" build -trimpath -o "$BIN/$name.tmp" .
    ) || die "building tests/interop/$name failed"
    mv -f "$BIN/$name.tmp" "$BIN/$name"
    rm -rf "$work"
    rmdir "$DIR/src" 2>/dev/null || true
    echo "$digest" >"$stamp"
    echo "interop-tools: $name built in $((SECONDS - start))s" >&2
}

print_paths() {
    echo "client=$BIN/client"
    echo "server=$BIN/server"
    echo "compression=$BIN/compression"
    echo "descriptor_set=$DESCRIPTOR_SET"
}

cmd_build() {
    mkdir -p "$BIN"
    go_env
    # One build at a time (parallel test runs, other helpers).
    exec 9>"$DIR/.lock"
    flock 9
    local start=$SECONDS
    grpc_command client google.golang.org/grpc/interop/client
    grpc_command server google.golang.org/grpc/interop/server
    our_command compression
    our_command descriptors
    # Rewritten when the program is: the set comes from the descriptors it was built with.
    if [[ ! -s $DESCRIPTOR_SET || $DESCRIPTOR_SET -ot $BIN/descriptors ]]; then
        "$BIN/descriptors" -out "$DESCRIPTOR_SET.tmp" || die "writing $DESCRIPTOR_SET failed"
        mv -f "$DESCRIPTOR_SET.tmp" "$DESCRIPTOR_SET"
    fi
    if ((SECONDS - start > 1)); then
        echo "interop-tools: built in $((SECONDS - start))s" >&2
    fi
    print_paths
}

case ${1:-} in
build) cmd_build ;;
paths) print_paths ;;
*)
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
    ;;
esac
