#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the inspector's browser test
# (tests/e2e/test_inspector_browser.py), from Debian's own packages:
#
#   scripts/install-chromium.sh          install chromium + chromium-driver unless both
#                                        are already on PATH; print their versions
#
# Idempotent: when `chromium` and `chromedriver` are both found it changes
# nothing. Otherwise it runs `apt-get update` and `apt-get install -y chromium
# chromium-driver` (as root, or through sudo when that is available). Debian's
# chromedriver is built for Debian's chromium, so their versions always match
# (fonts-dejavu-core: without recommends, pages would render without a font);
# nothing is downloaded from anywhere but the distribution's archive.
set -euo pipefail

die() {
    printf 'install-chromium: %s\n' "$*" >&2
    exit 1
}

installed() {
    command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1
}

as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        die "not root and no sudo: install the Debian packages chromium and chromium-driver"
    fi
}

if ! installed; then
    command -v apt-get >/dev/null 2>&1 ||
        die "no apt-get: install Chromium and its chromedriver (same version) by hand"
    # Wait for another apt/dpkg run (a second helper, unattended upgrades) instead of failing.
    apt_opts=(-o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)
    as_root apt-get "${apt_opts[@]}" update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y -qq \
        --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
    installed || die "apt-get finished but chromium or chromedriver is still not on PATH"
fi

# 2>/dev/null: Debian's chromium wrapper script prints a harmless "[: unexpected
# operator" on some machines while it sizes its cache.
printf '%s\n%s\n' "$(chromium --version 2>/dev/null)" "$(chromedriver --version)"
