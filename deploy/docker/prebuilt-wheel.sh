#!/usr/bin/env bash
# Use a wheel built outside the image (`make wheel`: dist/stratad-*.whl) instead
# of building one: check that it belongs to the sources in the current directory
# (the build context's copy of the checkout), then copy it into DIST. The
# Dockerfile's builder stage runs it when STRATAD_WHEEL names a file;
# scripts/check_dockerfile.py runs it outside Docker on the wheel build-wheel.sh made.
#
#   prebuilt-wheel.sh WHEEL DIST
#
# Checks: the file exists; its name is an abi3 manylinux wheel of stratad; its
# version is Cargo.toml's (maturin takes the version from there); and its
# Python files are byte for byte those of python/stratad here, none missing
# and none extra. The Rust extension cannot be compared without rebuilding it;
# scripts/docker/image.sh rebuilds the wheel when a Rust source is newer.
set -euo pipefail
WHEEL=${1:?usage: prebuilt-wheel.sh WHEEL DIST}
DIST=${2:?usage: prebuilt-wheel.sh WHEEL DIST}
PYTHON=${PYTHON:-python3}

if [ ! -f "$WHEEL" ]; then
    echo "prebuilt-wheel.sh: no wheel $WHEEL; the build context's dist/ holds:" \
         "$(cd "$(dirname "$WHEEL")" && ls stratad-*.whl 2>/dev/null || echo nothing)" >&2
    echo "  (run \`make wheel\`, or build from source: --build-arg STRATAD_WHEEL=source)" >&2
    exit 1
fi
name=$(basename "$WHEEL")
case "$name" in
    stratad-*-cp311-abi3-manylinux*.whl) ;;
    *)
        echo "prebuilt-wheel.sh: $name is not a stratad cp311-abi3 manylinux wheel" >&2
        exit 1
        ;;
esac
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
wheel_version=${name#stratad-}
wheel_version=${wheel_version%%-*}
if [ "$wheel_version" != "$version" ]; then
    echo "prebuilt-wheel.sh: $name is version $wheel_version, the sources are $version" >&2
    exit 1
fi
"$PYTHON" - "$WHEEL" <<'PY'
import pathlib, sys, zipfile

wheel = zipfile.ZipFile(sys.argv[1])
source = pathlib.Path("python")
in_wheel = {
    n: wheel.read(n) for n in wheel.namelist() if n.startswith("stratad/") and n.endswith((".py", ".pyi"))
}
in_tree = {
    str(p.relative_to(source)): p.read_bytes()
    for p in (source / "stratad").rglob("*")
    if p.suffix in (".py", ".pyi") and "__pycache__" not in p.parts
}
differ = sorted(n for n in in_wheel.keys() & in_tree.keys() if in_wheel[n] != in_tree[n])
missing = sorted(in_tree.keys() - in_wheel.keys())
extra = sorted(in_wheel.keys() - in_tree.keys())
if differ or missing or extra:
    for label, names in (("differ", differ), ("not in the wheel", missing), ("only in the wheel", extra)):
        if names:
            print(f"  {label}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}", file=sys.stderr)
    sys.exit(
        f"prebuilt-wheel.sh: {pathlib.Path(sys.argv[1]).name} was not built from these sources"
        " (run `make wheel` again)"
    )
print(f"prebuilt-wheel.sh: {len(in_wheel)} Python files match the sources")
PY
mkdir -p "$DIST"
cp "$WHEEL" "$DIST/"
ls -l "$DIST/$name"
