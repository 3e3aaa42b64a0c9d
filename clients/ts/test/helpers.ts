// Shared by the test files: which daemons the tests may use (set by
// tests/e2e/test_client_ts.py, or by hand), and small assertions.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { StratadError } from "../src/index.js";

/** A plaintext daemon with auth off (HOST:PORT). */
export const ADDRESS = process.env.STRATAD_TEST_ADDRESS ?? "";
/** The same daemon's unix socket (unix:/path), optional. */
export const UNIX_ADDRESS = process.env.STRATAD_TEST_UNIX_ADDRESS ?? "";
/** A daemon with TLS and auth=token, its CA file, an agent token of tenant "acme" and an admin token. */
export const AUTH = {
  address: process.env.STRATAD_TEST_AUTH_ADDRESS ?? "",
  caFile: process.env.STRATAD_TEST_TLS_CA ?? "",
  agentToken: process.env.STRATAD_TEST_AGENT_TOKEN ?? "",
  adminToken: process.env.STRATAD_TEST_ADMIN_TOKEN ?? "",
};
/** A daemon with auth=mtls (same CA) and a client certificate it maps to tenant "acme". */
export const MTLS = {
  address: process.env.STRATAD_TEST_MTLS_ADDRESS ?? "",
  certFile: process.env.STRATAD_TEST_CLIENT_CERT ?? "",
  keyFile: process.env.STRATAD_TEST_CLIENT_KEY ?? "",
};

export function skipUnless(value: string, variable: string): string | false {
  return value ? false : `${variable} is not set (start a daemon, or run tests/e2e/test_client_ts.py)`;
}

/** A session ID no other test uses. */
export function uniqueId(prefix: string): string {
  return `${prefix}-${randomUUID().slice(0, 8)}`;
}

/**
 * Awaits `promise`, which must fail with `ErrorClass` and one of `reasons`;
 * returns the error for further checks.
 */
export async function rejectsWith<E extends StratadError>(
  promise: Promise<unknown>,
  ErrorClass: new (...args: never[]) => E,
  reasons: readonly string[],
): Promise<E> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof ErrorClass, `expected ${ErrorClass.name}, got ${String(error)}`);
    assert.ok(reasons.includes(error.reason), `reason ${error.reason} is not one of ${reasons.join(", ")}`);
    return error;
  }
  assert.fail(`expected ${ErrorClass.name}, but the call succeeded`);
}

export const decode = (bytes: Uint8Array): string => new TextDecoder().decode(bytes);
