#!/usr/bin/env bash
# Installs and builds the TypeScript client (clients/ts) for its tests:
# `npm ci` when node_modules is missing or older than package-lock.json, then
# `npm run build` (tsc, a few seconds) so dist/ matches src/.
#
#   scripts/ts-client-deps.sh        idempotent; prints "node vX npm Y" first
#
# Needs Node.js 20 or later with npm (https://nodejs.org, or the NodeSource
# Debian packages: Debian's own nodejs may be older). npm ci downloads the
# exact versions of package-lock.json from the npm registry into ~/.npm
# (which survives fresh clones) and node_modules/.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PACKAGE=$ROOT/clients/ts
MIN_NODE_MAJOR=20

die() { echo "ts-client-deps: $*" >&2; exit 1; }

command -v node >/dev/null || die "node is not installed (Node.js >= $MIN_NODE_MAJOR with npm is needed)"
command -v npm >/dev/null || die "npm is not installed (it ships with Node.js)"
major=$(node -p 'process.versions.node.split(".")[0]')
[ "$major" -ge "$MIN_NODE_MAJOR" ] || die "node $(node --version) is too old: $MIN_NODE_MAJOR or later is needed"
echo "node $(node --version) npm $(npm --version)"

cd "$PACKAGE"
# The hash of the lockfile node_modules was installed from: a changed lockfile reinstalls.
stamp=node_modules/.stratad-lock-sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    npm ci --no-audit --no-fund --loglevel=error
    echo "$want" >"$stamp"
fi
npm run --silent build
