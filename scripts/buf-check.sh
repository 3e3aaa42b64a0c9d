#!/usr/bin/env bash
# buf over proto/ with the pinned tools of scripts/go-tools.sh (built on first use).
#
#   scripts/buf-check.sh lint       buf lint: STANDARD rules (buf.yaml)
#   scripts/buf-check.sh breaking   buf breaking of the work tree against the previous
#                                   commit (HEAD~1; BUF_AGAINST=REF picks another)
#   scripts/buf-check.sh gen-go     regenerate the Go code of clients/go/stratadv1
#   scripts/buf-check.sh check-go   fail when clients/go/stratadv1 differs from a regeneration
#
# Why HEAD~1: CI runs on a fresh clone of main, where HEAD is the newest commit
# (for a merge, HEAD~1 is main before the merge). Comparing HEAD with its
# parent checks exactly what that commit changed in the API; a merge-base with
# main would be HEAD itself there, and check nothing.
#
# The baseline: the commit that added buf.yaml also moved go_package to where
# the Go client's code lives (clients/go/stratadv1; no code was ever generated
# at the old path). Against a commit without buf.yaml, FILE_SAME_GO_PACKAGE
# alone is not checked, so that merge passes; every later commit is checked by
# every rule of buf.yaml.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
GO_OUT=clients/go/stratadv1

die() {
    printf 'buf-check: %s\n' "$*" >&2
    exit 1
}

tools_on_path() {
    local bin
    bin=$(bash scripts/go-tools.sh install) || die "could not install the Go tools"
    export PATH=$bin:$PATH
}

cmd_lint() {
    buf lint
    echo "buf lint: clean (STANDARD)"
}

cmd_breaking() {
    local against=${BUF_AGAINST:-HEAD~1} commit
    if ! commit=$(git rev-parse --verify --quiet "$against^{commit}"); then
        if [[ $(git rev-parse --is-shallow-repository) == true ]]; then
            die "$against is not in this shallow clone: fetch more history (git fetch --deepen=1)"
        fi
        echo "buf breaking: no $against (the first commit): nothing to compare with"
        return
    fi
    local input=".git#ref=$commit,subdir=proto" config=()
    if ! git cat-file -e "$commit:buf.yaml" 2>/dev/null; then
        echo "buf breaking: $against predates buf.yaml: FILE_SAME_GO_PACKAGE not checked (see $0)"
        config=(--config '{"version":"v2","modules":[{"path":"proto"}],"breaking":{"use":["FILE"],"except":["FILE_SAME_GO_PACKAGE"]}}')
    fi
    buf breaking "${config[@]}" --against "$input"
    echo "buf breaking: no breaking change against $against ($(git rev-parse --short "$commit"))"
}

# Generate into a fresh directory; print it.
generate_go() {
    local out
    out=$(mktemp -d)
    buf generate --template buf.gen.yaml -o "$out" >&2
    [[ -d $out/$GO_OUT ]] || die "buf generate wrote nothing to $GO_OUT"
    echo "$out"
}

cmd_gen_go() {
    local out
    out=$(generate_go)
    rm -rf "$GO_OUT"
    mkdir -p "$(dirname "$GO_OUT")"
    mv "$out/$GO_OUT" "$GO_OUT"
    rm -rf "$out"
    echo "buf-check: generated $GO_OUT ($(ls "$GO_OUT" | wc -l) files)"
}

cmd_check_go() {
    local out status=0
    out=$(generate_go)
    if ! diff -r "$out/$GO_OUT" "$GO_OUT" >/dev/null; then
        diff -rq "$out/$GO_OUT" "$GO_OUT" >&2 || true
        echo "buf-check: $GO_OUT is stale: run 'make go-gen' and commit" >&2
        status=1
    else
        echo "buf-check: $GO_OUT is fresh"
    fi
    rm -rf "$out"
    return "$status"
}

case ${1:-} in
lint | breaking | gen-go | check-go)
    tools_on_path
    cmd=${1//-/_}
    "cmd_$cmd"
    ;;
*)
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
    ;;
esac
