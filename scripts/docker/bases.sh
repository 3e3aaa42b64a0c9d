#!/usr/bin/env bash
# Local base images for deploy/Dockerfile when no container registry answers
# (scripts/docker/image.sh calls this; so can you).
#
#   bash scripts/docker/bases.sh python   a stand-in for python:3.11-slim-bookworm
#   bash scripts/docker/bases.sh rust     a stand-in for rust:1.95-slim-bookworm
#
# Prints the image reference (last line of stdout) after making sure the
# engine has it. Both are Debian bookworm roots made by debootstrap from
# Debian's mirror (reachable where registries are not), with the security
# updates applied and docs, man pages, locales and apt lists removed, the way
# Debian's own slim images are cut:
#
#   python  minbase + python3 (3.11) + python3-venv + ca-certificates: what the
#           Dockerfile's runtime stage needs from python:3.11-slim-bookworm
#           (a python3 that makes virtualenvs, and a CA bundle for pip);
#   rust    the same + gcc + libc6-dev, and this machine's Rust toolchain
#           (`rustc --print sysroot`, without its docs and sources) in
#           /usr/local/rust: a Rust image that needs neither Docker Hub nor
#           static.rust-lang.org. Only a source build of the wheel
#           (STRATAD_IMAGE_WHEEL=source) needs it.
#
# Cache: the root filesystem is a tarball in $STRATAD_DOCKER_CACHE
# (~/.cache/stratad-docker), named by suite, ISO week and recipe (and the
# rustc version for rust), e.g. python-3.11-bookworm-2026W48-r1.tar.gz, and the
# image is tagged the same (stratad-local/python:3.11-bookworm-2026W48-r1). A second
# run finds the image (instant) or imports the tarball (seconds); debootstrap
# (about a minute or two) runs again once a week, to pick up Debian's security
# updates. STRATAD_BASE_KEY overrides the week (e.g. to pin one for a release).
set -euo pipefail
KIND=${1:?usage: bases.sh python|rust}
SUITE=${STRATAD_DEBIAN_SUITE:-bookworm}
MIRROR=${STRATAD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${STRATAD_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
CACHE=${STRATAD_DOCKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stratad-docker}
KEY=${STRATAD_BASE_KEY:-$(date -u +%GW%V)}
# Bump when the recipe below changes, so cached bases are rebuilt.
RECIPE=r1

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
log() { echo "bases.sh: $*" >&2; }

case "$KIND" in
    python)
        packages=python3,python3-venv,ca-certificates
        repo=python tag=3.11-$SUITE-$KEY-$RECIPE
        ;;
    rust)
        command -v rustc >/dev/null || {
            log "the local Rust base copies this machine's Rust toolchain: install Rust (rustup) first"
            exit 1
        }
        SYSROOT=$(rustc --print sysroot)
        rust_version=$(rustc -V | awk '{print $2}')
        packages=python3,python3-venv,ca-certificates,gcc,libc6-dev
        repo=rust tag=$rust_version-$SUITE-$KEY-$RECIPE
        ;;
    *)
        log "unknown base '$KIND' (python or rust)"
        exit 2
        ;;
esac
image=stratad-local/$repo:$tag
name=$repo-$tag
tarball=$CACHE/$name.tar.gz

if docker image inspect "$image" >/dev/null 2>&1; then
    echo "$image"
    exit 0
fi

if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || {
        log "installing debootstrap (Debian package)"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            debootstrap >/dev/null
    }
    mkdir -p "$CACHE"
    root=$(mktemp -d "$CACHE/.rootfs-$name.XXXXXX")
    trap 'as_root rm -rf "$root"' EXIT
    log "debootstrap $SUITE ($packages) from $MIRROR into $root"
    start=$SECONDS
    as_root debootstrap --variant=minbase --include="$packages" "$SUITE" "$root" "$MIRROR" \
        >"$root.log" 2>&1 || {
        log "debootstrap failed; the end of $root.log:"
        tail -n 30 "$root.log" >&2
        exit 1
    }
    rm -f "$root.log"
    # Security and point-release updates: what Debian's own images carry.
    as_root tee "$root/etc/apt/sources.list" >/dev/null <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
EOF
    as_root chroot "$root" /usr/bin/env DEBIAN_FRONTEND=noninteractive \
        sh -c 'apt-get update -qq && apt-get upgrade -y -qq' >"$root.log" 2>&1 || {
        log "apt-get upgrade in the new root failed; the end of $root.log:"
        tail -n 30 "$root.log" >&2
        exit 1
    }
    rm -f "$root.log"
    # From now on dpkg skips docs, man pages and translations (Debian's slim
    # images do the same), and apt keeps no .deb files: later apt-get installs
    # in a build stage stay small too.
    as_root tee "$root/etc/dpkg/dpkg.cfg.d/docker-slim" >/dev/null <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
    as_root tee "$root/etc/apt/apt.conf.d/docker-clean" >/dev/null <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    # What the image does not need: what debootstrap and apt left behind, the
    # build host's resolv.conf and hostname (the engine mounts its own), docs.
    as_root sh -c "cd '$root' \
        && rm -rf var/lib/apt/lists/* var/cache/apt/* var/cache/debconf/*-old var/lib/dpkg/*-old \
                  var/log/* tmp/* usr/share/man/* usr/share/info/* usr/share/groff/* \
                  usr/share/lintian/* usr/share/locale/* \
        && find usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete \
        && find usr/share/doc -mindepth 1 -type d -empty -delete \
        && : >etc/resolv.conf && echo localhost >etc/hostname && : >etc/machine-id"
    if [ "$KIND" = rust ]; then
        # The toolchain minus its HTML docs (share/) and library sources: rustc,
        # cargo, the standard library and the linker wrappers are what a build uses.
        log "copying the Rust toolchain $rust_version from $SYSROOT"
        as_root mkdir -p "$root/usr/local/rust"
        tar -C "$SYSROOT" -c --exclude=./share --exclude=./lib/rustlib/src \
            --exclude=./lib/rustlib/rustc-src . | as_root tar -C "$root/usr/local/rust" -x
    fi
    log "packing $tarball"
    gzip=(gzip -1)
    command -v pigz >/dev/null && gzip=(pigz -1)
    as_root tar -C "$root" --numeric-owner -c . | "${gzip[@]}" >"$tarball.tmp"
    mv "$tarball.tmp" "$tarball"
    # Older bases of this kind are stale from now on.
    for old in "$CACHE/$repo"-*.tar.gz; do
        [ "$old" = "$tarball" ] || rm -f "$old"
    done
    log "built $tarball ($(du -h "$tarball" | cut -f1)) in $((SECONDS - start))s"
fi

log "docker import $tarball -> $image"
changes=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
         --change 'ENV LANG=C.UTF-8' --change 'CMD ["bash"]')
if [ "$KIND" = rust ]; then
    # Where rust:*-slim keeps them, so scripts written for that image work here.
    changes=(--change 'ENV PATH=/usr/local/rust/bin:/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
             --change 'ENV CARGO_HOME=/usr/local/cargo' --change 'ENV LANG=C.UTF-8' --change 'CMD ["bash"]')
fi
docker import "${changes[@]}" --message "stratad local base: debootstrap $SUITE ($packages)" \
    - "$image" <"$tarball" >/dev/null
echo "$image"
