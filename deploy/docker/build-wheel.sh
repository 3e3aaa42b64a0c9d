#!/usr/bin/env bash
# Build the stratad wheel into DIST (default ./dist) with maturin, in a throwaway
# virtualenv. Run from the repository root. The Dockerfile's builder stage runs
# it, and so does scripts/check_deploy.sh outside Docker.
set -euo pipefail
DIST=${1:-dist}
MATURIN_VERSION=${MATURIN_VERSION:-1.16.0}
BUILD_VENV=${BUILD_VENV:-$(mktemp -d)/venv}
PYTHON=${PYTHON:-python3}

"$PYTHON" -m venv "$BUILD_VENV"
"$BUILD_VENV/bin/pip" install --quiet --disable-pip-version-check "maturin==$MATURIN_VERSION"
"$BUILD_VENV/bin/maturin" build --release --locked --out "$DIST" --interpreter "$PYTHON"
ls -l "$DIST"/stratad-*.whl
