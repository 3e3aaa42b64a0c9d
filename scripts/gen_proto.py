#!/usr/bin/env python3
"""Regenerate the committed protobuf code in python/stratad/api/ from proto/.

    python scripts/gen_proto.py           # rewrite the generated files
    python scripts/gen_proto.py --check   # exit 1 if the committed files are stale

Every ``*.proto`` under ``proto/`` is compiled with proto root ``proto`` and
output root ``python``, so ``proto/stratad/api/v1/x.proto`` becomes
``python/stratad/api/v1/x_pb2.py`` (+ ``.pyi`` from mypy-protobuf and
``x_pb2_grpc.py`` + ``.pyi``) importable as ``stratad.api.v1.x_pb2``.

Both modes generate into a temporary directory first, so ``--check`` compares
exactly what a regeneration would write. The output depends on the versions
of grpcio-tools and mypy-protobuf: CI must use the same ones as the commit.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_ROOT = ROOT / "python"
# Generated files are only ever written below this package, and stale ones
# (whose .proto was deleted) are only ever removed from below it.
GENERATED_PACKAGE = OUT_ROOT / "stratad" / "api"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
INIT_TEXT = '"""Generated protobuf code: do not edit, run scripts/gen_proto.py."""\n'


def find_protos() -> list[Path]:
    """All .proto files, relative to the proto root, in a stable order."""
    return sorted(p.relative_to(PROTO_ROOT) for p in PROTO_ROOT.rglob("*.proto"))


def find_mypy_plugin(name: str = "protoc-gen-mypy") -> Path:
    """A mypy-protobuf plugin from the running interpreter's environment, else PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file():
        return candidate
    found = shutil.which(name)
    if found is None:
        sys.exit(f"gen_proto: {name} not found (pip install mypy-protobuf)")
    return Path(found)


def run_protoc(protos: list[Path], out_dir: Path) -> None:
    """Compile ``protos`` into ``out_dir`` with the bundled protoc."""
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError:
        sys.exit("gen_proto: grpc_tools not found (pip install grpcio-tools)")
    # The well-known types (google/protobuf/*.proto) ship inside grpc_tools.
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={well_known}",
        f"--plugin=protoc-gen-mypy={find_mypy_plugin()}",
        f"--plugin=protoc-gen-mypy_grpc={find_mypy_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *(str(p) for p in protos),
    ]
    if protoc.main(args) != 0:
        sys.exit("gen_proto: protoc failed")


def generated_files(gen_dir: Path) -> dict[Path, Path]:
    """Map each committed path (relative to OUT_ROOT) to its freshly generated source."""
    return {p.relative_to(gen_dir): p for p in gen_dir.rglob("*") if p.is_file()}


def required_inits(generated: dict[Path, Path]) -> set[Path]:
    """The __init__.py files that make every directory of generated code a package."""
    inits = set()
    for rel in generated:
        for directory in rel.parents:
            # stratad/ is hand-written and has its own __init__.py.
            if directory not in (Path(), Path("stratad")):
                inits.add(directory / "__init__.py")
    return inits


def committed_generated() -> set[Path]:
    """Generated-looking files currently under the generated package."""
    if not GENERATED_PACKAGE.exists():
        return set()
    return {
        p.relative_to(OUT_ROOT)
        for p in GENERATED_PACKAGE.rglob("*")
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def differences(generated: dict[Path, Path]) -> list[str]:
    """Human-readable list of what a regeneration would change in the tree."""
    problems = []
    for rel, source in sorted(generated.items()):
        target = OUT_ROOT / rel
        if not target.exists():
            problems.append(f"missing: {target.relative_to(ROOT)}")
        elif not filecmp.cmp(source, target, shallow=False):
            problems.append(f"differs: {target.relative_to(ROOT)}")
    for rel in sorted(required_inits(generated)):
        if not (OUT_ROOT / rel).exists():
            problems.append(f"missing: {(OUT_ROOT / rel).relative_to(ROOT)}")
    for rel in sorted(committed_generated() - generated.keys()):
        problems.append(f"stale (no .proto): {(OUT_ROOT / rel).relative_to(ROOT)}")
    return problems


def write(generated: dict[Path, Path]) -> None:
    """Copy the generated files into place, add missing __init__.py, delete stale files."""
    for rel, source in sorted(generated.items()):
        target = OUT_ROOT / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    for rel in required_inits(generated):
        init = OUT_ROOT / rel
        if not init.exists():  # never overwrite: a package may re-export names
            init.write_text(INIT_TEXT)
    for rel in committed_generated() - generated.keys():
        (OUT_ROOT / rel).unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 listing every generated file that is out of date",
    )
    args = parser.parse_args(argv)
    protos = find_protos()
    if not protos:
        sys.exit(f"gen_proto: no .proto files under {PROTO_ROOT}")
    with tempfile.TemporaryDirectory(prefix="gen_proto-") as tmp:
        gen_dir = Path(tmp) / "out"
        gen_dir.mkdir()
        run_protoc(protos, gen_dir)
        generated = generated_files(gen_dir)
        if args.check:
            problems = differences(generated)
            for line in problems:
                print(line, file=sys.stderr)
            if problems:
                print("gen_proto: run `python scripts/gen_proto.py` and commit", file=sys.stderr)
            return 1 if problems else 0
        write(generated)
    print(f"gen_proto: generated code for {len(protos)} proto file(s) in {OUT_ROOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
