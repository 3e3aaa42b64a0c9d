#!/usr/bin/env bash
# Build stratad's wheel into DIST (default ./dist) with maturin: `make wheel`.
# Run from anywhere; needs python3 (>= 3.11) and Rust (cargo).
#
# The wheel is abi3 (pyo3's abi3-py311: one wheel for every CPython >= 3.11)
# and manylinux: maturin checks the extension's glibc symbol versions and tags
# the wheel with the oldest manylinux policy they allow: manylinux_2_34
# (glibc >= 2.34) when built on Debian 12 with Rust 1.95. The build reuses
# ./target (CARGO_TARGET_DIR), so after `make dev` or `make build` it only
# repackages: seconds, not minutes.
#
# ZIG=1 links with zig (the ziglang wheel from PyPI, installed on first use
# into .tools/ziglang) against glibc 2.17: a manylinux2014 wheel for older
# systems (glibc >= 2.17). It is a cross build into target/x86_64-unknown-linux-gnu,
# so the first one is a full release build (3.5-6 min on 2 cores); CI does not
# run it (docs/install.md).
#
# DIST is emptied of older stratad-*.whl first, so `dist/stratad-*.whl` names
# exactly one file. The wheel's path is the last line printed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIST=$(realpath -m "${DIST:-$ROOT/dist}")
PYTHON=${PYTHON:-python3}
MATURIN_VERSION=${MATURIN_VERSION:-1.16.0}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

# maturin: the dev venv's if there is one, else a throwaway venv's (PyPI).
MATURIN=${MATURIN:-$ROOT/.venv/bin/maturin}
if [ ! -x "$MATURIN" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$PYTHON" -m venv "$tmp/venv"
    "$tmp/venv/bin/pip" install --quiet --disable-pip-version-check "maturin==$MATURIN_VERSION"
    MATURIN=$tmp/venv/bin/maturin
fi

cd "$ROOT"  # maturin reads ./pyproject.toml
zig=()
if [ "${ZIG:-0}" = 1 ]; then
    ZIG_VENV=${ZIG_VENV:-$ROOT/.tools/ziglang}
    ZIGLANG_VERSION=${ZIGLANG_VERSION:-0.15.2}
    if ! "$ZIG_VENV/bin/python" -m ziglang version 2>/dev/null | grep -qx "$ZIGLANG_VERSION"; then
        "$PYTHON" -m venv "$ZIG_VENV"
        "$ZIG_VENV/bin/pip" install --quiet --disable-pip-version-check "ziglang==$ZIGLANG_VERSION"
    fi
    # maturin finds zig as `python3 -m ziglang` on PATH.
    export PATH=$ZIG_VENV/bin:$PATH
    zig=(--zig --compatibility manylinux2014)
fi
mkdir -p "$DIST"
rm -f "$DIST"/stratad-*.whl
start=$SECONDS
"$MATURIN" build --release --locked "${zig[@]}" --interpreter "$PYTHON" --out "$DIST"
wheels=("$DIST"/stratad-*.whl)
if [ "${#wheels[@]}" -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
    echo "expected one stratad-*.whl in $DIST, found: ${wheels[*]}" >&2
    exit 1
fi
wheel=${wheels[0]}
# abi3 + manylinux x86_64 (or aarch64): anything else (linux_x86_64, a
# cp311-cp311 tag) is not what docs/install.md promises.
case "$(basename "$wheel")" in
    stratad-*-cp311-abi3-manylinux_2_*_x86_64.whl | stratad-*-cp311-abi3-manylinux_2_*_aarch64.whl) ;;
    stratad-*-cp311-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl) ;;
    *)
        echo "unexpected wheel tag: $(basename "$wheel") (want cp311-abi3-manylinux_2_XX)" >&2
        exit 1
        ;;
esac
echo "built in $((SECONDS - start))s: $(du -h "$wheel" | cut -f1)"
echo "$wheel"
