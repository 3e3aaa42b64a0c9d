// Against a real daemon with TLS and auth=token (tests/e2e/test_client_ts.py
// starts one): STRATAD_TEST_AUTH_ADDRESS, STRATAD_TEST_TLS_CA, and tokens of an
// agent of tenant "acme" (STRATAD_TEST_AGENT_TOKEN) and of an admin
// (STRATAD_TEST_ADMIN_TOKEN); and a daemon with auth=mtls, STRATAD_TEST_MTLS_ADDRESS,
// with a client certificate it maps to tenant "acme" (STRATAD_TEST_CLIENT_CERT/_KEY).
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import {
  PermissionDeniedError,
  Reason,
  StratadClient,
  UnauthenticatedError,
  UnavailableError,
} from "../src/index.js";
import { AUTH, MTLS, decode, rejectsWith, skipUnless, uniqueId } from "./helpers.js";

describe("TLS and bearer tokens", { skip: skipUnless(AUTH.address, "STRATAD_TEST_AUTH_ADDRESS") }, () => {
  const tls = { caFile: AUTH.caFile };

  async function withClient<T>(options: ConstructorParameters<typeof StratadClient>[0], use: (c: StratadClient) => Promise<T>) {
    const client = new StratadClient({ address: AUTH.address, tls, env: {}, ...options });
    try {
      return await use(client);
    } finally {
      client.close();
    }
  }

  test("an agent token acts in its own tenant; an admin naming that tenant sees its sessions", async () => {
    const sessionId = uniqueId("agent");
    await withClient({ token: AUTH.agentToken }, async (agent) => {
      await agent.createSession(sessionId);
      await agent.saveState(sessionId, "agent's state");
      assert.equal(decode((await agent.loadState(sessionId)).data), "agent's state");
    });
    await withClient({ token: AUTH.adminToken, tenant: "acme" }, async (admin) => {
      assert.equal(decode((await admin.loadState(sessionId)).data), "agent's state");
    });
  });

  test("no token, or an unknown one, is UnauthenticatedError with the reason", async () => {
    await withClient({}, (anonymous) =>
      rejectsWith(anonymous.getSession("s"), UnauthenticatedError, [Reason.MISSING_CREDENTIALS]),
    );
    await withClient({ token: "not-a-known-token" }, (stranger) =>
      rejectsWith(stranger.getSession("s"), UnauthenticatedError, [Reason.INVALID_TOKEN]),
    );
  });

  test("an agent naming another tenant, or calling AdminService, is PermissionDeniedError", async () => {
    await withClient({ token: AUTH.agentToken, tenant: "someone-else" }, (agent) =>
      rejectsWith(agent.getSession("s"), PermissionDeniedError, [Reason.TENANT_MISMATCH]),
    );
    await withClient({ token: AUTH.agentToken }, (agent) =>
      rejectsWith(agent.admin.getStoreStats({}), PermissionDeniedError, [Reason.ADMIN_ROLE_REQUIRED]),
    );
  });

  test("STRATAD_TOKEN_FILE and STRATAD_TLS_CA alone are enough to connect", async () => {
    const tokenFile = join(mkdtempSync(join(tmpdir(), "stratad-ts-")), "token");
    writeFileSync(tokenFile, `${AUTH.agentToken}\n`);
    const env = { STRATAD_ADDRESS: AUTH.address, STRATAD_TOKEN_FILE: tokenFile, STRATAD_TLS_CA: AUTH.caFile };
    const client = new StratadClient({ env });
    try {
      assert.ok(client.connection.tls);
      const sessionId = uniqueId("env");
      await client.createSession(sessionId);
      assert.equal((await client.getSession(sessionId)).sessionId, sessionId);
    } finally {
      client.close();
    }
  });

  test("the certificate is checked: the right serverName passes, a wrong one or plaintext fails", async () => {
    // The daemon's certificate names localhost and 127.0.0.1.
    await withClient({ token: AUTH.agentToken, tls: { ...tls, serverName: "localhost" } }, async (client) => {
      const sessionId = uniqueId("sni");
      await client.createSession(sessionId);
    });
    const noRetry = { maxAttempts: 1 };
    await withClient(
      { token: AUTH.agentToken, tls: { ...tls, serverName: "not-the-daemon.example" }, retry: noRetry },
      (client) => assert.rejects(client.getSession("s"), UnavailableError),
    );
    // Without the CA, Node's default CAs do not trust the test CA.
    await withClient({ token: AUTH.agentToken, tls: true, retry: noRetry }, (client) =>
      assert.rejects(client.getSession("s"), UnavailableError),
    );
    // Plaintext to a TLS listener never reaches the daemon's services.
    await withClient({ token: AUTH.agentToken, tls: false, retry: noRetry, deadlineMs: 5000 }, (client) =>
      assert.rejects(client.getSession("s"), UnavailableError),
    );
  });
});

describe("mutual TLS", { skip: skipUnless(MTLS.address, "STRATAD_TEST_MTLS_ADDRESS") }, () => {
  test("the client certificate from STRATAD_TLS_CERT/_KEY is the identity; without one the handshake fails", async () => {
    const env = {
      STRATAD_ADDRESS: MTLS.address,
      STRATAD_TLS_CA: AUTH.caFile,
      STRATAD_TLS_CERT: MTLS.certFile,
      STRATAD_TLS_KEY: MTLS.keyFile,
    };
    const client = new StratadClient({ env });
    const sessionId = uniqueId("mtls");
    try {
      await client.createSession(sessionId);
      await client.saveState(sessionId, "over mTLS");
      assert.equal(decode((await client.loadState(sessionId)).data), "over mTLS");
      // The certificate maps to an agent of "acme": naming another tenant is refused.
      const elsewhere = new StratadClient({ env, tenant: "someone-else" });
      try {
        await rejectsWith(elsewhere.getSession(sessionId), PermissionDeniedError, [Reason.TENANT_MISMATCH]);
      } finally {
        elsewhere.close();
      }
    } finally {
      client.close();
    }
    const noCertificate = new StratadClient({
      address: MTLS.address,
      tls: { caFile: AUTH.caFile },
      retry: { maxAttempts: 1 },
      env: {},
    });
    try {
      await assert.rejects(noCertificate.getSession(sessionId), UnavailableError);
    } finally {
      noCertificate.close();
    }
  });
});
