#!/usr/bin/env bash
# The Go tools of the proto toolchain, built from the Go module proxy at pinned
# versions and cached (idempotent: a tool is rebuilt only when its pinned
# version changes):
#
#   buf                 github.com/bufbuild/buf/cmd/buf          lint, breaking, generate
#   protoc-gen-go       google.golang.org/protobuf/cmd/protoc-gen-go
#   protoc-gen-go-grpc  google.golang.org/grpc/cmd/protoc-gen-go-grpc
#   grpcurl             github.com/fullstorydev/grpcurl/cmd/grpcurl   the docs' grpcurl
#                       examples, run by tests/docs
#
#   scripts/go-tools.sh install   build the missing or outdated tools; print the bin dir
#   scripts/go-tools.sh bin       print the bin dir (no build)
#
# They go to $STRATAD_GO_TOOLS_DIR/bin, by default $HOME/.cache/stratad-tools/bin,
# which survives fresh clones on the same machine. Module downloads and build
# outputs use Go's own caches (GOMODCACHE, GOCACHE). Needs only `go` (PATH or
# /usr/local/go/bin); the first build of buf takes a few minutes.
set -euo pipefail
# shellcheck source=lib/go.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/go.sh"

# Bump deliberately (`go list -m -json MODULE@latest`), then run
# `make go-gen` and commit: generated Go code depends on the plugin versions.
BUF_VERSION=v1.75.0
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
GRPCURL_VERSION=v1.9.4

TOOLS=${STRATAD_GO_TOOLS_DIR:-$HOME/.cache/stratad-tools}
BIN=$TOOLS/bin
INSTALL_TIMEOUT=${INSTALL_TIMEOUT:-1500}

# go install NAME from MODULE@VERSION into $BIN unless the stamp says it is there.
go_tool() {  # name package version
    local name=$1 package=$2 version=$3 stamp=$BIN/.$1.version
    if [[ -x $BIN/$name && "$(cat "$stamp" 2>/dev/null)" == "$version" ]]; then
        return
    fi
    local go start=$SECONDS
    go=$(find_go)
    echo "go-tools: installing $name $version (go install $package@$version)" >&2
    # Outside any module, so that no go.mod around us is consulted or changed.
    (cd "$TOOLS" && GOBIN=$BIN GOFLAGS=-modcacherw GOTOOLCHAIN=${GOTOOLCHAIN:-auto} \
        timeout "$INSTALL_TIMEOUT" "$go" install -trimpath "$package@$version") ||
        die "go install $package@$version failed"
    echo "$version" >"$stamp"
    echo "go-tools: $name $version built in $((SECONDS - start))s" >&2
}

cmd_install() {
    mkdir -p "$BIN"
    go_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
    go_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"
    go_tool buf github.com/bufbuild/buf/cmd/buf "$BUF_VERSION"
    go_tool grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl "$GRPCURL_VERSION"
    echo "$BIN"
}

case ${1:-} in
install) cmd_install ;;
bin) echo "$BIN" ;;
*)
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
    ;;
esac
