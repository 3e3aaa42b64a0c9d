#!/usr/bin/env bash
# Install the stratad wheel found in DIST into a virtualenv at PREFIX, with the
# daemon's runtime dependencies (the `server` extra: a plain install is the
# SDK's, and its `stratad serve` exits 2 asking for the extra) and nothing
# else. The Dockerfile's runtime stage runs it, and so does
# scripts/check_deploy.sh outside Docker.
set -euo pipefail
DIST=${1:?usage: install-runtime.sh DIST PREFIX}
PREFIX=${2:?usage: install-runtime.sh DIST PREFIX}
PYTHON=${PYTHON:-python3}

shopt -s nullglob
wheels=("$DIST"/stratad-*.whl)
if [ "${#wheels[@]}" -ne 1 ]; then
    echo "install-runtime.sh: expected exactly one stratad wheel in $DIST, found ${#wheels[@]}" >&2
    exit 1
fi
"$PYTHON" -m venv "$PREFIX"
"$PREFIX/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check "${wheels[0]}[server]"
# The installer itself is not needed to run stratad: pip and setuptools (with
# pkg_resources) are 26 MB of the image's 90 MB of packages. An image built
# FROM this one gets pip back with `/opt/stratad/bin/python -m ensurepip`.
"$PREFIX/bin/python" -m pip uninstall -qq --yes --disable-pip-version-check pip setuptools
# Smoke test: the console script runs, the native core loads, the daemon's
# code imports (the server extra is there).
"$PREFIX/bin/stratad" --version
"$PREFIX/bin/python" -c "import stratad.native as n; assert len(n.digest_hex(b'')) == 64"
"$PREFIX/bin/python" -c "import stratad.server.app"
