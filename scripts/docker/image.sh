#!/usr/bin/env bash
# `make image`: build deploy/Dockerfile with a real Docker engine, tagged
# stratad:dev and stratad:<version> (Cargo.toml's), printing each step's time,
# the build context's size and the image's size with what fills it.
#
#   bash scripts/docker/image.sh
#
# 1. engine: scripts/docker/engine.sh (installs Debian's docker.io and starts
#    dockerd when none answers). Builds use the legacy builder (Debian's
#    docker.io has no buildx), so the Dockerfile keeps to classic syntax.
# 2. wheel: by default the image gets the wheel `make wheel` builds from this
#    checkout (dist/), and the Dockerfile's builder stage only checks it against
#    the sources (STRATAD_WHEEL=<file>): compiling the Rust core again inside
#    the build would cost ~6 minutes on 2 cores, every time a source changes (no
#    cargo cache survives a legacy build). When dist/'s wheel is missing or older
#    than a source file, `make wheel` runs first (seconds when ./target is
#    warm). STRATAD_IMAGE_WHEEL=source builds from source inside the image
#    instead (the Dockerfile's default, what a user with a registry gets);
#    =prebuilt refuses to fall back to it.
# 3. bases: python:3.11-slim-bookworm (and, for a source build,
#    rust:1.95-slim-bookworm), the Dockerfile's defaults, when the engine has
#    them or can pull them; otherwise local stand-ins made by
#    scripts/docker/bases.sh with debootstrap from Debian's mirror (cached under
#    ~/.cache/stratad-docker: seconds after the first run).
#    STRATAD_IMAGE_BASES=local skips the registry, =registry refuses the stand-ins.
# 4. CA certificates: the *.crt under /usr/local/share/ca-certificates (this
#    machine's extra roots, e.g. a TLS-intercepting proxy's; STRATAD_EXTRA_CA_DIR
#    to use another directory, empty for none) go in as EXTRA_CA_CERTS, so pip
#    and cargo inside the build trust what the host trusts.
set -euo pipefail
cd "$(dirname "$0")/../.."
DOCKERFILE=deploy/Dockerfile
WHEEL_MODE=${STRATAD_IMAGE_WHEEL:-auto}
BASES_MODE=${STRATAD_IMAGE_BASES:-auto}
CA_DIR=${STRATAD_EXTRA_CA_DIR-/usr/local/share/ca-certificates}
PULL_TIMEOUT=${STRATAD_PULL_TIMEOUT:-90}
LOG_DIR=${STRATAD_DOCKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stratad-docker}
BUILD_LOG=$LOG_DIR/image-build.log
# pyproject.toml's version is dynamic: maturin takes it from Cargo.toml, so
# the wheel's and the image's come from there.
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
# STRATAD_IMAGE_TAGS (space-separated) replaces the two, e.g. to build a
# source-built image beside stratad:dev and compare.
read -r -a TAGS <<<"${STRATAD_IMAGE_TAGS:-stratad:dev stratad:$VERSION}"

started=$SECONDS
step_start=$SECONDS
step() {
    printf '\n--- %s (at %ss)\n' "$1" "$((SECONDS - started))"
    step_start=$SECONDS
}
done_in() { echo "    done in $((SECONDS - step_start))s"; }
die() { echo "image.sh: $*" >&2; exit 1; }

# --- 1. engine ----------------------------------------------------------------------
step "engine: scripts/docker/engine.sh"
bash scripts/docker/engine.sh
echo "    dockerd $(docker version --format '{{.Server.Version}}'), storage $(docker info --format '{{.Driver}}')"
done_in

# --- 2. wheel -----------------------------------------------------------------------
step "wheel: $WHEEL_MODE"
wheel_arg=source
newest_source() {  # the newest source file that goes into the wheel (build outputs aside)
    find rust python Cargo.toml Cargo.lock pyproject.toml README.md -type f \
        -not -path '*/__pycache__/*' -not -name '*.so' -not -name '*.pyc' -not -path '*/target/*' \
        -printf '%T@ %p\n' | sort -n | tail -n 1
}
current_wheel() {  # dist/'s wheel of this version, if it is newer than every source
    local wheels=(dist/stratad-"$VERSION"-*.whl)
    [ "${#wheels[@]}" -eq 1 ] && [ -f "${wheels[0]}" ] || return 1
    local newest
    newest=$(newest_source)
    if [ "$(stat -c %Y "${wheels[0]}")" -lt "${newest%%.*}" ]; then
        echo "    ${wheels[0]} is older than ${newest#* }" >&2
        return 1
    fi
    echo "${wheels[0]}"
}
case "$WHEEL_MODE" in
    source) ;;
    auto | prebuilt)
        if ! wheel=$(current_wheel); then
            if command -v cargo >/dev/null; then
                echo "    make wheel (scripts/build-wheel.sh; reuses ./target)"
                bash scripts/build-wheel.sh 2>&1 | sed 's/^/    /' || die "make wheel failed (output above)"
                wheel=$(current_wheel) || die "scripts/build-wheel.sh left no current wheel in dist/"
            elif [ "$WHEEL_MODE" = prebuilt ]; then
                die "no current wheel in dist/ and no cargo to build one (make wheel)"
            else
                wheel=
                echo "    no current wheel in dist/ and no cargo here: building from source in the image"
            fi
        fi
        if [ -n "$wheel" ]; then
            wheel_arg=$(basename "$wheel")
            echo "    using $wheel ($(du -h "$wheel" | cut -f1)); the builder stage checks it against the sources"
        fi
        ;;
    *) die "STRATAD_IMAGE_WHEEL=$WHEEL_MODE: expected auto, prebuilt or source" ;;
esac
[ "$wheel_arg" != source ] || echo "    the builder stage compiles the Rust core (minutes)"
done_in

# --- 3. bases -------------------------------------------------------------------------
step "bases: $BASES_MODE"
default_base() { sed -n "s/^ARG $1=//p" "$DOCKERFILE"; }
base() {  # kind (python|rust) -> an image the engine has
    local kind=$1 wanted
    wanted=$(default_base "${kind^^}_IMAGE")
    if [ "$BASES_MODE" != local ]; then
        if docker image inspect "$wanted" >/dev/null 2>&1; then
            echo "    $kind: $wanted (already in the engine)" >&2
            echo "$wanted"
            return
        fi
        local out
        if out=$(timeout "$PULL_TIMEOUT" docker pull -q "$wanted" 2>&1); then
            echo "    $kind: $wanted (pulled)" >&2
            echo "$wanted"
            return
        fi
        [ "$BASES_MODE" != registry ] || die "cannot pull $wanted: ${out:-timed out after ${PULL_TIMEOUT}s}"
        echo "    $kind: cannot pull $wanted (${out:-timed out after ${PULL_TIMEOUT}s}); a local base instead" >&2
    fi
    local t=$SECONDS image
    image=$(bash scripts/docker/bases.sh "$kind" | tail -n 1)
    echo "    $kind: $image (scripts/docker/bases.sh, $((SECONDS - t))s)" >&2
    echo "$image"
}
python_image=$(base python)
if [ "$wheel_arg" = source ]; then
    rust_image=$(base rust)
else
    # The builder stage only checks and copies the wheel: the Python base does.
    rust_image=$python_image
fi
done_in

# --- 4. build ---------------------------------------------------------------------------
ca_args=()
ca_files=()
if [ -n "$CA_DIR" ] && [ -d "$CA_DIR" ]; then
    mapfile -t ca_files < <(find "$CA_DIR" -name '*.crt' -type f | sort)
fi
if [ "${#ca_files[@]}" -gt 0 ]; then
    ca_args=(--build-arg "EXTRA_CA_CERTS=$(cat "${ca_files[@]}")")
fi
step "build: $DOCKERFILE -> ${TAGS[*]}"
echo "    PYTHON_IMAGE=$python_image RUST_IMAGE=$rust_image STRATAD_WHEEL=$wheel_arg"
echo "    EXTRA_CA_CERTS: ${#ca_files[@]} file(s)${ca_files[*]:+: ${ca_files[*]}}"
echo "    full log: $BUILD_LOG"
mkdir -p "$LOG_DIR"
tag_args=()
for tag in "${TAGS[@]}"; do tag_args+=(-t "$tag"); done
# The builder stage is built and tagged first (stratad-builder:dev): the full
# build then finds it in the cache, and the builder image of the previous run,
# now untagged, can be pruned with the runtime image it made (both carry the
# title label) instead of piling up (1.4 GB each for a source build).
builder_tag=stratad-builder:${TAGS[0]#*:}
build=(docker build -f "$DOCKERFILE"
    --build-arg "PYTHON_IMAGE=$python_image" --build-arg "RUST_IMAGE=$rust_image"
    --build-arg "STRATAD_WHEEL=$wheel_arg" "${ca_args[@]}"
    --label org.opencontainers.image.title=stratad
    --label "org.opencontainers.image.version=$VERSION")
# DOCKER_BUILDKIT=0: the legacy builder, the only one Debian's docker.io has;
# its deprecation notice is expected.
if ! { DOCKER_BUILDKIT=0 "${build[@]}" --target builder -t "$builder_tag" . \
        && echo "=== runtime" && DOCKER_BUILDKIT=0 "${build[@]}" "${tag_args[@]}" .; } \
        >"$BUILD_LOG" 2>&1; then
    echo "image.sh: docker build failed; the end of $BUILD_LOG:" >&2
    tail -n 40 "$BUILD_LOG" >&2
    exit 1
fi
# The FROM and RUN steps, cached or not, and what stratad's scripts said (the
# builder's from the first build, the runtime's from the second).
sed 's/\x1b\[[0-9;]*m//g' "$BUILD_LOG" | awk '
    function flush() { if (step != "") { gsub(/ +/, " ", step); print "    " substr(step, 1, 110) (cached ? "  [cached]" : "") } }
    /^=== runtime/ { flush(); step = ""; skip = 1; next }
    skip && / AS runtime$/ { skip = 0 }
    skip { next }
    /^Step [0-9]+\/[0-9]+ : / { flush(); step = ""; if ($4 == "FROM" || $4 == "RUN") step = $0; cached = 0; next }
    /Using cache/ { cached = 1 }
    /^(prebuilt-wheel|add-ca-certificates|install-runtime)\.sh:|^stratad [0-9]/ { flush(); step = ""; print "      " $0 }
    END { flush() }'
context=$(sed -n 's/^Sending build context to Docker daemon *//p' "$BUILD_LOG" | head -n 1)
echo "    build context: $context (.dockerignore)"
# This script's earlier images, untagged by this build.
docker image prune -f --filter label=org.opencontainers.image.title=stratad >/dev/null
done_in

# --- 5. the result --------------------------------------------------------------------------
step "image"
size=$(docker image inspect -f '{{.Size}}' "${TAGS[0]}")
base_size=$(docker image inspect -f '{{.Size}}' "$python_image")
mb() { echo "$((($1 + 500000) / 1000000)) MB"; }
echo "    ${TAGS[*]}: $(mb "$size")" \
     "(base $python_image: $(mb "$base_size"); stratad and its packages: $(mb $((size - base_size))))"
# What fills /opt/stratad (the venv the runtime stage installs), largest first.
docker run --rm --network none --entrypoint /bin/sh "${TAGS[0]}" -c \
    'cd /opt/stratad/lib/python3*/site-packages && du -sk -- * | sort -rn | head -n 8' |
    awk '{printf "      %6.1f MB  %s\n", $1 / 1024, $2}'
printf '\nimage.sh: %s built in %ss\n' "${TAGS[*]}" "$((SECONDS - started))"
