#!/usr/bin/env bash
# Add the PEM certificates in $EXTRA_CA_CERTS (the Dockerfile's build arg of the
# same name; empty: nothing to do) to the system trust store, which
# /etc/ssl/certs/ca-certificates.crt bundles. Both image stages run it: the
# builder's pip and cargo and the runtime stage's pip reach PyPI and crates.io
# through whatever TLS-intercepting proxy the builder sits behind, and the
# daemon's own outgoing TLS (replication to object storage) trusts the same store.
#
#   docker build --build-arg EXTRA_CA_CERTS="$(cat corp-root.pem)" ...
#
# Each certificate gets its own file, as update-ca-certificates expects.
set -euo pipefail
if [ -z "${EXTRA_CA_CERTS:-}" ]; then
    exit 0
fi
if ! command -v update-ca-certificates >/dev/null; then
    echo "add-ca-certificates.sh: EXTRA_CA_CERTS given, but this base image has no" \
         "update-ca-certificates (Debian's ca-certificates package)" >&2
    exit 1
fi
dir=/usr/local/share/ca-certificates/stratad-extra
mkdir -p "$dir"
printf '%s\n' "$EXTRA_CA_CERTS" | awk -v dir="$dir" '
    /-----BEGIN CERTIFICATE-----/ { n++; file = sprintf("%s/extra-%02d.crt", dir, n) }
    file { print > file }
    /-----END CERTIFICATE-----/ { close(file); file = "" }
    END { if (n == 0) { print "add-ca-certificates.sh: EXTRA_CA_CERTS holds no PEM certificate" > "/dev/stderr"; exit 1 } }'
update-ca-certificates >/dev/null
echo "add-ca-certificates.sh: added $(find "$dir" -name '*.crt' | wc -l) certificate(s) to /etc/ssl/certs/ca-certificates.crt"
