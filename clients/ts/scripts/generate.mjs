#!/usr/bin/env node
// Regenerates the committed protobuf code in src/gen/ from the repository's
// proto/stratad/api/v1/*.proto (and the vendored google/rpc/error_details.proto).
//
//   npm run generate          rewrite src/gen/
//   npm run check:generated   exit 1 when src/gen/ differs from a regeneration
//
// protoc comes from grpcio-tools (the Python package that generates the
// Python code too, pinned in pyproject.toml), the plugin is protoc-gen-es
// from this package's devDependencies: the output depends only on those two
// pinned versions. The Python interpreter is $STRATAD_PYTHON, else the
// repository's .venv, else python3 on PATH.
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, cpSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const REPO = resolve(PACKAGE, "..", "..");
const OUT = join(PACKAGE, "src", "gen");
const PROTO_ROOTS = [join(REPO, "proto"), join(PACKAGE, "proto")];
const PLUGIN = join(PACKAGE, "node_modules", ".bin", "protoc-gen-es");

function python() {
  if (process.env.STRATAD_PYTHON) return process.env.STRATAD_PYTHON;
  const venv = join(REPO, ".venv", "bin", "python");
  return existsSync(venv) ? venv : "python3";
}

function listFiles(dir, suffix) {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { recursive: true })
    .map(String)
    .filter((f) => f.endsWith(suffix) && statSync(join(dir, f)).isFile())
    .sort();
}

function generate(outDir) {
  if (!existsSync(PLUGIN)) {
    throw new Error(`${PLUGIN} is missing: run npm ci in ${PACKAGE}`);
  }
  const interpreter = python();
  // The well-known types (google/protobuf/*.proto) ship inside grpc_tools.
  const wellKnown = execFileSync(
    interpreter,
    ["-c", "import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), '_proto'))"],
    { encoding: "utf8" },
  ).trim();
  const protos = PROTO_ROOTS.flatMap((root) => listFiles(root, ".proto"));
  execFileSync(
    interpreter,
    [
      "-m",
      "grpc_tools.protoc",
      ...PROTO_ROOTS.map((root) => `--proto_path=${root}`),
      `--proto_path=${wellKnown}`,
      `--plugin=protoc-gen-es=${PLUGIN}`,
      `--es_out=${outDir}`,
      // TypeScript sources; imports end in .js so tsc's Node ESM output runs as is.
      "--es_opt=target=ts,import_extension=js",
      ...protos,
    ],
    { stdio: "inherit" },
  );
}

function differences(expectedDir, actualDir) {
  const expected = listFiles(expectedDir, "");
  const actual = listFiles(actualDir, "");
  const names = [...new Set([...expected, ...actual])].sort();
  return names.filter((name) => {
    const a = join(expectedDir, name);
    const b = join(actualDir, name);
    return !existsSync(a) || !existsSync(b) || !readFileSync(a).equals(readFileSync(b));
  });
}

const check = process.argv.includes("--check");
const scratch = mkdtempSync(join(tmpdir(), "stratad-ts-gen-"));
try {
  generate(scratch);
  if (check) {
    const stale = differences(scratch, OUT);
    if (stale.length > 0) {
      console.error(`${relative(REPO, OUT)} is stale; run npm run generate. Differs: ${stale.join(", ")}`);
      process.exit(1);
    }
    console.log(`${relative(REPO, OUT)} is up to date with the protos`);
  } else {
    rmSync(OUT, { recursive: true, force: true });
    cpSync(scratch, OUT, { recursive: true });
    console.log(`generated ${relative(REPO, OUT)}`);
  }
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
