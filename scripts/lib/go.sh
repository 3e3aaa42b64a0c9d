# Sourced by the scripts that build test tools with Go (go-tools.sh,
# interop-tools.sh, h2spec.sh, s3-test-server.sh): how they fail, and where
# they find the Go toolchain.

die() {
    printf '%s: %s\n' "$(basename "$0" .sh)" "$*" >&2
    exit 1
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
