#!/usr/bin/env bash
# Installs and builds @stratad/langgraph (clients/langgraph-js) and the
# LangGraph.js examples (examples/langgraphjs) for their tests, from a clean
# checkout or an up-to-date one (idempotent, a few seconds when nothing changed):
#
#   1. clients/ts (@stratad/client, which this package links as file:../ts):
#      scripts/ts-client-deps.sh (npm ci when its lock changed, then tsc);
#   2. clients/langgraph-js: npm ci when package-lock.json changed, then tsc;
#   3. examples/langgraphjs: npm ci when its package-lock.json changed (it
#      links file:../../clients/langgraph-js).
#
#   clients/langgraph-js/scripts/deps.sh     prints "node vX npm Y" first
#
# npm ci downloads the exact versions of each package-lock.json from the npm
# registry into ~/.npm and node_modules/.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROOT=$(cd "$HERE/../.." && pwd)

"$ROOT/scripts/ts-client-deps.sh"

# npm ci in $1 unless node_modules was installed from this very lockfile.
ci_when_stale() {
    local stamp=$1/node_modules/.stratad-lock-sha256 want
    want=$(sha256sum "$1/package-lock.json" | cut -d' ' -f1)
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        (cd "$1" && npm ci --no-audit --no-fund --loglevel=error)
        echo "$want" >"$stamp"
    fi
}

ci_when_stale "$HERE"
(cd "$HERE" && npm run --silent build)
ci_when_stale "$ROOT/examples/langgraphjs"
