#!/usr/bin/env bash
# h2spec, the HTTP/2 conformance tester that tests/edge/test_h2spec.py runs
# against every listener of the daemon, built from the Go module proxy at a
# pinned version and cached (idempotent: rebuilt only when this script changes):
#
#   h2spec        github.com/summerwind/h2spec/cmd/h2spec v2.2.1, unchanged
#   h2spec-mtls   the same test cases (h2spec's own packages, its Run()) with a
#                 client certificate: --client-cert FILE --client-key FILE, and
#                 h2spec's -h -p -P -o -j -k -S -v --dryrun --max-header-length
#                 (TLS always on). h2spec's command line has no flag for a client
#                 certificate (only h2specd, its server-side twin, fills the
#                 config's CertFile/CertKeyFile), so an mTLS listener refuses it
#                 before any HTTP/2 frame; this wrapper only fills those fields
#
#   scripts/h2spec.sh [build]   build what is missing; print the path of h2spec
#                               (h2spec-mtls is beside it)
#   scripts/h2spec.sh path      print that path (no build)
#
# Both go to $STRATAD_GO_TOOLS_DIR/h2spec-<version>/bin, by default
# $HOME/.cache/stratad-tools/h2spec-v2.2.1/bin (as scripts/go-tools.sh), which
# survives fresh clones on the same machine. Needs only `go` (PATH or
# /usr/local/go/bin); module downloads and build outputs use Go's own caches.
# A cold build takes about 20s.
#
# The module proxy has v2.2.1 only as v2.2.1+incompatible: h2spec has no
# go.mod (it used dep, whose Gopkg.lock pins commits of 2017-2018), so
# `go install ...@v2.2.1+incompatible` would take whatever its dependencies'
# latest versions are that day. It is built instead in a throwaway module
# that pins every dependency at a tagged version (below): the tags closest to
# Gopkg.lock where they exist, and a current golang.org/x/net (h2spec only uses
# its HTTP/2 framer and HPACK codec, with illegal reads and writes allowed).
set -euo pipefail
# shellcheck source=lib/go.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/go.sh"

H2SPEC_VERSION=v2.2.1
# Bump deliberately; the test's expectations (docs/native.md) were made with these.
GO_MOD_REQUIRES='
	github.com/summerwind/h2spec v2.2.1+incompatible
	github.com/fatih/color v1.7.0
	github.com/inconshreveable/mousetrap v1.0.0
	github.com/mattn/go-colorable v0.1.0
	github.com/mattn/go-isatty v0.0.4
	github.com/spf13/cobra v0.0.3
	github.com/spf13/pflag v1.0.3
	golang.org/x/net v0.47.0
	golang.org/x/sys v0.38.0
	golang.org/x/text v0.31.0
'

TOOLS=${STRATAD_GO_TOOLS_DIR:-$HOME/.cache/stratad-tools}
DIR=$TOOLS/h2spec-$H2SPEC_VERSION
BIN=$DIR/bin
STAMP=$BIN/.version
INSTALL_TIMEOUT=${INSTALL_TIMEOUT:-1500}

write_module() {  # dir
    local work=$1
    mkdir -p "$work/cmd/h2spec-mtls"
    printf 'module stratad.local/h2spec-build\n\ngo 1.24.0\n\nrequire (%s)\n' \
        "$GO_MOD_REQUIRES" >"$work/go.mod"
    # Keeps h2spec's command in the module's build list for `go mod tidy`.
    cat >"$work/tools.go" <<'EOF'
//go:build tools

package tools

import _ "github.com/summerwind/h2spec/cmd/h2spec"
EOF
    cat >"$work/cmd/h2spec-mtls/main.go" <<'EOF'
// h2spec-mtls runs h2spec's test cases over TLS presenting a client
// certificate: h2spec's config.Config has CertFile/CertKeyFile (its
// TLSConfig() puts them in tls.Config.Certificates) but h2spec's command
// line never sets them.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/summerwind/h2spec"
	"github.com/summerwind/h2spec/config"
)

func main() {
	host := flag.String("h", "127.0.0.1", "Target host")
	port := flag.Int("p", 443, "Target port")
	path := flag.String("P", "/", "Target path")
	timeout := flag.Int("o", 2, "Time seconds to test timeout")
	maxHeaderLen := flag.Int("max-header-length", 4000, "Maximum length of HTTP header")
	junitReport := flag.String("j", "", "Path for JUnit test report")
	strict := flag.Bool("S", false, "Run all test cases including strict test cases")
	dryRun := flag.Bool("dryrun", false, "Display only the title of test cases")
	insecure := flag.Bool("k", false, "Don't verify server's certificate")
	verbose := flag.Bool("v", false, "Output verbose log")
	certFile := flag.String("client-cert", "", "PEM client certificate (chain) to present")
	keyFile := flag.String("client-key", "", "PEM private key of --client-cert")
	flag.Parse()
	if *certFile == "" || *keyFile == "" {
		fmt.Fprintln(os.Stderr, "h2spec-mtls: --client-cert and --client-key are required")
		os.Exit(2)
	}
	c := &config.Config{
		Host:         *host,
		Port:         *port,
		Path:         *path,
		Timeout:      time.Duration(*timeout) * time.Second,
		MaxHeaderLen: *maxHeaderLen,
		JUnitReport:  *junitReport,
		Strict:       *strict,
		DryRun:       *dryRun,
		TLS:          true,
		Insecure:     *insecure,
		Verbose:      *verbose,
		Sections:     flag.Args(),
		CertFile:     *certFile,
		CertKeyFile:  *keyFile,
	}
	success, err := h2spec.Run(c)
	if err != nil {
		fmt.Printf("Error: %s", err)
		os.Exit(1)
	}
	if !success {
		os.Exit(1)
	}
}
EOF
}

cmd_build() {
    mkdir -p "$BIN"
    # One build at a time (parallel test runs).
    exec 9>"$DIR/.lock"
    flock 9
    local digest
    digest=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)
    if [[ -x $BIN/h2spec && -x $BIN/h2spec-mtls && "$(cat "$STAMP" 2>/dev/null)" == "$digest" ]]; then
        echo "$BIN/h2spec"
        return
    fi
    local go start=$SECONDS work=$DIR/src
    go=$(find_go)
    echo "h2spec.sh: building h2spec $H2SPEC_VERSION and h2spec-mtls from the Go module proxy" >&2
    rm -rf "$work"
    write_module "$work"
    (
        cd "$work"
        export GOFLAGS="-modcacherw -buildvcs=false" GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
        timeout "$INSTALL_TIMEOUT" "$go" mod tidy
        timeout "$INSTALL_TIMEOUT" "$go" build -trimpath -o "$BIN/h2spec.tmp" \
            -ldflags "-X main.VERSION=${H2SPEC_VERSION#v} -X main.COMMIT=module-proxy" \
            github.com/summerwind/h2spec/cmd/h2spec
        timeout "$INSTALL_TIMEOUT" "$go" build -trimpath -o "$BIN/h2spec-mtls.tmp" ./cmd/h2spec-mtls
    ) || die "building h2spec failed"
    mv -f "$BIN/h2spec.tmp" "$BIN/h2spec"
    mv -f "$BIN/h2spec-mtls.tmp" "$BIN/h2spec-mtls"
    rm -rf "$work"
    echo "$digest" >"$STAMP"
    echo "h2spec.sh: built in $((SECONDS - start))s" >&2
    echo "$BIN/h2spec"
}

case ${1:-build} in
build) cmd_build ;;
path) echo "$BIN/h2spec" ;;
*)
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
    ;;
esac
