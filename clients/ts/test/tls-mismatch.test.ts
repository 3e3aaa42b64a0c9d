// TLS mismatches name the fix (src/diagnose.ts), against real daemons
// (tests/e2e/test_client_ts.py and tests/e2e/test_tls_mismatch.py start them):
// the plaintext one (STRATAD_TEST_ADDRESS), the TLS one (STRATAD_TEST_AUTH_ADDRESS,
// its CA STRATAD_TEST_TLS_CA) and the mTLS one (STRATAD_TEST_MTLS_ADDRESS).
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Code, Reason, StratadClient, UnavailableError, type StratadClientOptions } from "../src/index.js";
import { ADDRESS, AUTH, MTLS, rejectsWith, skipUnless } from "./helpers.js";

async function failure(options: StratadClientOptions, call: (client: StratadClient) => Promise<unknown>) {
  const client = new StratadClient({ env: {}, deadlineMs: 20_000, ...options });
  try {
    return await rejectsWith(call(client), UnavailableError, [
      Reason.TLS_REQUIRED,
      Reason.CLIENT_CERT_REQUIRED,
      Reason.TLS_NOT_SUPPORTED,
    ]);
  } finally {
    client.close();
  }
}

function namesTheFix(error: UnavailableError, reason: string, ...fixes: string[]): void {
  assert.equal(error.reason, reason, error.message);
  assert.equal(error.code, Code.Unavailable);
  assert.equal(error.codeName, "UNAVAILABLE");
  for (const fix of fixes) assert.ok(error.message.includes(fix), `"${fix}" is not in: ${error.message}`);
}

describe("a TLS mismatch is UnavailableError whose message names the fix", () => {
  test(
    "a plaintext client on a TLS daemon: TLS_REQUIRED",
    { skip: skipUnless(AUTH.address, "STRATAD_TEST_AUTH_ADDRESS") },
    async () => {
      const error = await failure({ address: AUTH.address, tls: false }, (c) => c.getSession("s"));
      namesTheFix(error, Reason.TLS_REQUIRED, `${AUTH.address} speaks TLS`, "caFile", "STRATAD_TLS_CA");
      assert.equal(error.metadata.address, AUTH.address);
      // A stream that cannot connect says the same.
      const watch = await failure({ address: AUTH.address, tls: false }, async (c) => {
        for await (const event of c.watchSession("s")) void event;
      });
      namesTheFix(watch, Reason.TLS_REQUIRED, `${AUTH.address} speaks TLS`);
    },
  );

  test(
    "a TLS client without a certificate on an mTLS daemon: CLIENT_CERT_REQUIRED",
    { skip: skipUnless(MTLS.address, "STRATAD_TEST_MTLS_ADDRESS") },
    async () => {
      const error = await failure({ address: MTLS.address, tls: { caFile: AUTH.caFile } }, (c) => c.getSession("s"));
      namesTheFix(
        error,
        Reason.CLIENT_CERT_REQUIRED,
        `${MTLS.address} requires a client certificate`,
        "certFile",
        "STRATAD_TLS_CERT",
      );
    },
  );

  test(
    "a TLS client on a plaintext daemon: TLS_NOT_SUPPORTED",
    { skip: skipUnless(ADDRESS, "STRATAD_TEST_ADDRESS") || skipUnless(AUTH.caFile, "STRATAD_TEST_TLS_CA") },
    async () => {
      const error = await failure({ address: ADDRESS, tls: { caFile: AUTH.caFile } }, (c) => c.getSession("s"));
      namesTheFix(error, Reason.TLS_NOT_SUPPORTED, `${ADDRESS} does not speak TLS`, "tls: false", "STRATAD_TLS_CA");
    },
  );
});
