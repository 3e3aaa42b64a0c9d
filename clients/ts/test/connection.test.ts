// Connection settings from options and STRATAD_* variables, as the Python SDK resolves them.
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import {
  callHeaders,
  codeName,
  Code,
  DEFAULT_ADDRESS,
  parseAddress,
  resolveConnection,
  toStratadError,
  InternalError,
  VersionConflictError,
  UnavailableError,
} from "../src/index.js";
import { ConnectError } from "@connectrpc/connect";

describe("resolveConnection", () => {
  test("defaults without options or variables", () => {
    const connection = resolveConnection({ env: {} });
    assert.deepEqual(connection, { address: DEFAULT_ADDRESS, tenant: "", token: "", tls: null });
    assert.deepEqual(callHeaders(connection), {});
  });

  test("variables fill what options leave unset or empty, options win", () => {
    const env = { STRATAD_ADDRESS: "db:7000", STRATAD_TENANT: "acme", STRATAD_TOKEN: "t0k" };
    assert.deepEqual(resolveConnection({ env }), { address: "db:7000", tenant: "acme", token: "t0k", tls: null });
    const given = resolveConnection({ env, address: "other:1", tenant: "", token: "mine" });
    assert.deepEqual(given, { address: "other:1", tenant: "acme", token: "mine", tls: null });
    assert.deepEqual(callHeaders(given), { "x-stratad-tenant": "acme", authorization: "Bearer mine" });
  });

  test("STRATAD_TOKEN_FILE is read and trimmed; STRATAD_TOKEN wins over it", () => {
    const file = join(mkdtempSync(join(tmpdir(), "stratad-ts-")), "token");
    writeFileSync(file, "from-file\n");
    assert.equal(resolveConnection({ env: { STRATAD_TOKEN_FILE: file } }).token, "from-file");
    assert.equal(resolveConnection({ env: { STRATAD_TOKEN_FILE: file, STRATAD_TOKEN: "direct" } }).token, "direct");
  });

  test("a STRATAD_TLS* variable turns TLS on; tls: false turns it off", () => {
    assert.equal(resolveConnection({ env: { STRATAD_TLS: "no" } }).tls, null);
    assert.deepEqual(resolveConnection({ env: { STRATAD_TLS: "TRUE" } }).tls, {
      caFile: "", certFile: "", keyFile: "", serverName: "",
    });
    const env = { STRATAD_TLS_CA: "/ca.pem", STRATAD_TLS_SERVER_NAME: "stratad.internal" };
    assert.deepEqual(resolveConnection({ env }).tls, {
      caFile: "/ca.pem", certFile: "", keyFile: "", serverName: "stratad.internal",
    });
    assert.equal(resolveConnection({ env, tls: false }).tls, null);
    assert.deepEqual(resolveConnection({ env: {}, tls: true }).tls, {});
  });

  test("a client certificate without its key is refused", () => {
    assert.throws(() => resolveConnection({ env: { STRATAD_TLS_CERT: "/c.pem" } }), /needs its key/);
  });
});

describe("parseAddress", () => {
  test("TCP, IPv6 and unix forms", () => {
    assert.deepEqual(parseAddress("127.0.0.1:50051"), { kind: "tcp", host: "127.0.0.1", port: 50051 });
    assert.deepEqual(parseAddress("[::1]:9"), { kind: "tcp", host: "[::1]", port: 9 });
    assert.deepEqual(parseAddress("unix:/run/stratad.sock"), { kind: "unix", path: "/run/stratad.sock" });
    assert.deepEqual(parseAddress("unix:///run/stratad.sock"), { kind: "unix", path: "/run/stratad.sock" });
  });

  test("anything else is refused with the address in the message", () => {
    for (const bad of ["localhost", "host:0", "host:99999", "http://host:1", "unix:"]) {
      assert.throws(() => parseAddress(bad), new RegExp(JSON.stringify(bad).replace(/[/.*+?^${}()|[\]\\]/g, "\\$&")));
    }
  });
});

describe("toStratadError", () => {
  test("a status without ErrorInfo gets its class and the code's reason", () => {
    const error = toStratadError(new ConnectError("gone", Code.Unavailable));
    assert.ok(error instanceof UnavailableError);
    assert.equal(error.reason, "UNAVAILABLE");
    assert.equal(error.codeName, "UNAVAILABLE");
    assert.ok(toStratadError(new ConnectError("stale", Code.Aborted)) instanceof VersionConflictError);
    assert.equal(toStratadError(new ConnectError("stale", Code.Aborted)).reason, "VERSION_CONFLICT");
  });

  test("a transport failure is UnavailableError, never a daemon status such as VERSION_CONFLICT", () => {
    // connect-node reports a reset connection as ABORTED, a TLS failure as INTERNAL.
    const reset = Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" });
    const fromReset = toStratadError(new ConnectError("read ECONNRESET", Code.Aborted, undefined, undefined, reset));
    assert.ok(fromReset instanceof UnavailableError, String(fromReset));
    assert.equal(fromReset.reason, "UNAVAILABLE");
    const tls = Object.assign(new Error("altnames"), { code: "ERR_TLS_CERT_ALTNAME_INVALID" });
    assert.ok(toStratadError(new ConnectError("altnames", Code.Internal, undefined, undefined, tls)) instanceof UnavailableError);
    // The daemon's own statuses carry no Node.js error: they keep their code.
    assert.ok(toStratadError(new ConnectError("bug", Code.Internal)) instanceof InternalError);
  });

  test("code names are gRPC's", () => {
    assert.equal(codeName(Code.FailedPrecondition), "FAILED_PRECONDITION");
    assert.equal(codeName(Code.Canceled), "CANCELLED");
  });
});
