// Against a real daemon (auth off): STRATAD_TEST_ADDRESS=HOST:PORT.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  AlreadyExistsError,
  CanceledError,
  Code,
  DeadlineExceededError,
  InvalidArgumentError,
  NotFoundError,
  Reason,
  SessionStatus,
  StratadClient,
  VersionConflictError,
} from "../src/index.js";
import { ADDRESS, UNIX_ADDRESS, decode, rejectsWith, skipUnless, uniqueId } from "./helpers.js";

const NOT_FOUND_REASONS = [Reason.NOT_FOUND, Reason.SESSION_NOT_FOUND];

describe("sessions and checkpoints", { skip: skipUnless(ADDRESS, "STRATAD_TEST_ADDRESS") }, () => {
  let client: StratadClient;
  before(() => {
    client = new StratadClient({ address: ADDRESS, tenant: "ts-tests", env: {} });
  });
  after(() => client.close());

  test("create, get and list sessions", async () => {
    const prefix = uniqueId("list");
    const created = await client.createSession(`${prefix}-a`, {
      labels: { team: "ts" },
      retention: { keepLast: 3 },
    });
    assert.equal(created.sessionId, `${prefix}-a`);
    assert.equal(created.status, SessionStatus.ACTIVE);
    assert.equal(created.retention?.keepLast, 3);
    await client.createSession(`${prefix}-b`);
    const generated = await client.createSession();
    assert.ok(generated.sessionId.length > 0);

    const fetched = await client.getSession(`${prefix}-a`);
    assert.deepEqual(fetched.labels, { team: "ts" });
    // pageSize 1: the iterator follows next_page_token through every page.
    const listed: string[] = [];
    for await (const session of client.listSessions({ prefix, pageSize: 1 })) listed.push(session.sessionId);
    assert.deepEqual(listed, [`${prefix}-a`, `${prefix}-b`]);
  });

  test("save, load, list checkpoints, restore and fork", async () => {
    const sessionId = uniqueId("flow");
    await client.createSession(sessionId);
    const first = await client.saveJson(sessionId, { step: 1 }, { metadata: { step: 1, kind: "plan" } });
    const bytes = new Uint8Array([0, 1, 2, 255]);
    const second = await client.saveState(sessionId, bytes, {
      contentType: "application/octet-stream",
      metadata: { step: 2 },
      expectedVersion: first.version,
    });
    assert.ok(second.version > first.version);

    const latest = await client.loadState(sessionId);
    assert.deepEqual(latest.data, bytes);
    assert.equal(latest.checkpointId, second.checkpointId);
    assert.equal(latest.contentType, "application/octet-stream");
    const older = await client.loadJson<{ step: number }>(sessionId, { checkpointId: first.checkpointId });
    assert.deepEqual(older.value, { step: 1 });
    assert.deepEqual(older.state.metadata, { step: 1, kind: "plan" });

    const all: string[] = [];
    for await (const checkpoint of client.listCheckpoints(sessionId, { pageSize: 1 })) all.push(checkpoint.checkpointId);
    assert.deepEqual(all, [second.checkpointId, first.checkpointId]); // newest first
    const planned: string[] = [];
    for await (const checkpoint of client.listCheckpoints(sessionId, { metadataFilter: { kind: "plan" } })) {
      planned.push(checkpoint.checkpointId);
    }
    assert.deepEqual(planned, [first.checkpointId]);

    const named = await client.createCheckpoint(sessionId, { name: "before-restore" });
    assert.equal(named.name, "before-restore");
    const restored = await client.restoreCheckpoint(first.checkpointId, { makeCurrent: true });
    assert.equal(decode(restored.data), '{"step":1}');
    assert.equal((await client.getSession(sessionId)).headCheckpointId, first.checkpointId);

    const fork = await client.forkSession(second.checkpointId, { newSessionId: `${sessionId}-fork` });
    assert.equal(fork.forkedFromCheckpointId, second.checkpointId);
    assert.deepEqual((await client.loadState(fork.sessionId)).data, bytes);
    // The fork is a session of its own: saving to it leaves the source alone.
    await client.saveJson(fork.sessionId, { step: "forked" });
    assert.equal(decode((await client.loadState(sessionId)).data), '{"step":1}');
  });

  test("pause and resume", async () => {
    const sessionId = uniqueId("pause");
    await client.createSession(sessionId);
    const paused = await client.pauseExecution(sessionId, { state: { data: "paused-state" } });
    assert.equal(paused.session?.status, SessionStatus.PAUSED);
    assert.ok(paused.saved?.checkpointId);
    const resumed = await client.resumeExecution(sessionId);
    assert.equal(resumed.session?.status, SessionStatus.ACTIVE);
    assert.equal(decode(resumed.state?.data ?? new Uint8Array()), "paused-state");
  });

  test("a stale expectedVersion is VersionConflictError (ABORTED, VERSION_CONFLICT) and changes nothing", async () => {
    const sessionId = uniqueId("conflict");
    await client.createSession(sessionId);
    const saved = await client.saveState(sessionId, "v1");
    await client.saveState(sessionId, "v2");
    const error = await rejectsWith(
      client.saveState(sessionId, "stale", { expectedVersion: saved.version }),
      VersionConflictError,
      [Reason.VERSION_CONFLICT],
    );
    assert.equal(error.code, Code.Aborted);
    assert.equal(error.codeName, "ABORTED");
    assert.equal(decode((await client.loadState(sessionId)).data), "v2");
    await rejectsWith(client.deleteSession(sessionId, { expectedVersion: 1 }), VersionConflictError, [
      Reason.VERSION_CONFLICT,
    ]);
  });

  test("missing sessions and checkpoints are NotFoundError", async () => {
    const missing = uniqueId("missing");
    const error = await rejectsWith(client.getSession(missing), NotFoundError, NOT_FOUND_REASONS);
    assert.equal(error.code, Code.NotFound);
    assert.match(error.message, new RegExp(missing));
    await rejectsWith(client.loadState(missing), NotFoundError, NOT_FOUND_REASONS);
    await rejectsWith(client.forkSession("ckpt-does-not-exist"), NotFoundError, [
      Reason.NOT_FOUND,
      Reason.CHECKPOINT_NOT_FOUND,
    ]);
    // The raw generated clients throw the same typed errors.
    await rejectsWith(client.sessions.getSession({ sessionId: missing }), NotFoundError, NOT_FOUND_REASONS);
  });

  test("bad input is InvalidArgumentError; a taken ID is AlreadyExistsError", async () => {
    await rejectsWith(client.createSession("not a valid id!"), InvalidArgumentError, [
      Reason.INVALID_ARGUMENT,
      Reason.INVALID_ID,
    ]);
    const sessionId = uniqueId("taken");
    await client.createSession(sessionId);
    await rejectsWith(client.createSession(sessionId), AlreadyExistsError, [Reason.ALREADY_EXISTS]);
    // A client-chosen checkpoint ID makes a repeated save (a retry) fail instead of duplicating.
    const checkpointId = uniqueId("ckpt");
    await client.saveState(sessionId, "once", { checkpointId });
    await rejectsWith(client.saveState(sessionId, "twice", { checkpointId }), AlreadyExistsError, [
      Reason.ALREADY_EXISTS,
    ]);
    assert.equal((await client.getSession(sessionId)).checkpointCount, 1);
  });

  test("tenants are isolated: the same ID in two tenants, neither sees the other's", async () => {
    const sessionId = uniqueId("shared");
    const alpha = new StratadClient({ address: ADDRESS, tenant: "alpha", env: {} });
    const beta = new StratadClient({ address: ADDRESS, tenant: "beta", env: {} });
    try {
      await alpha.createSession(sessionId);
      const saved = await alpha.saveState(sessionId, "alpha's state");
      await rejectsWith(beta.getSession(sessionId), NotFoundError, NOT_FOUND_REASONS);
      await rejectsWith(beta.loadState(sessionId, { checkpointId: saved.checkpointId }), NotFoundError, [
        ...NOT_FOUND_REASONS,
        Reason.CHECKPOINT_NOT_FOUND,
      ]);
      const betaIds: string[] = [];
      for await (const session of beta.listSessions()) betaIds.push(session.sessionId);
      assert.ok(!betaIds.includes(sessionId));

      await beta.createSession(sessionId);
      await beta.saveState(sessionId, "beta's state");
      assert.equal(decode((await alpha.loadState(sessionId)).data), "alpha's state");
      assert.equal(decode((await beta.loadState(sessionId)).data), "beta's state");
    } finally {
      alpha.close();
      beta.close();
    }
  });

  test("watchSession streams events and ends with DeadlineExceededError at its deadline", async () => {
    const sessionId = uniqueId("watch");
    await client.createSession(sessionId);
    const saved = await client.saveState(sessionId, "watched");
    const kinds: string[] = [];
    await assert.rejects(async () => {
      for await (const event of client.watchSession(sessionId, { fromVersion: 0n, deadlineMs: 500 })) {
        kinds.push(event.kind);
      }
    }, DeadlineExceededError);
    assert.deepEqual(kinds, []); // fromVersion 0: only events after the watch began
    const replayed: string[] = [];
    await assert.rejects(async () => {
      for await (const event of client.watchSession(sessionId, { fromVersion: 1, deadlineMs: 500 })) {
        replayed.push(event.checkpointId);
      }
    }, DeadlineExceededError);
    assert.ok(replayed.includes(saved.checkpointId), `replayed ${replayed.join(",")}`);

    // Without a deadline a watch stays open until its signal ends it: CanceledError.
    const later = await client.saveState(sessionId, "later");
    const controller = new AbortController();
    const seen: string[] = [];
    await assert.rejects(async () => {
      const events = client.watchSession(sessionId, { fromVersion: saved.version, signal: controller.signal });
      for await (const event of events) {
        seen.push(event.checkpointId);
        if (event.checkpointId === later.checkpointId) controller.abort();
      }
    }, CanceledError);
    assert.ok(seen.includes(later.checkpointId), `seen ${seen.join(",")}`);
  });

  test("deadlineMs 0 means no deadline, for the client and for a call", async () => {
    const unbounded = new StratadClient({ address: ADDRESS, tenant: "ts-tests", env: {}, deadlineMs: 0 });
    try {
      const sessionId = uniqueId("nodeadline");
      await unbounded.createSession(sessionId);
      assert.equal((await unbounded.getSession(sessionId, { deadlineMs: 0 })).sessionId, sessionId);
      assert.equal((await client.getSession(sessionId, { deadlineMs: 0 })).sessionId, sessionId);
    } finally {
      unbounded.close();
    }
  });

  test("raw clients of other services share the connection and headers", async () => {
    const stats = await client.admin.getStoreStats({});
    assert.ok(stats.sessions >= 1n, `sessions ${stats.sessions}`);
  });

  test("a unix socket address works like TCP", { skip: skipUnless(UNIX_ADDRESS, "STRATAD_TEST_UNIX_ADDRESS") }, async () => {
    const overUnix = new StratadClient({ address: UNIX_ADDRESS, tenant: "ts-tests", env: {} });
    try {
      const sessionId = uniqueId("unix");
      await overUnix.createSession(sessionId);
      await overUnix.saveState(sessionId, "over a unix socket");
      assert.equal(decode((await client.loadState(sessionId)).data), "over a unix socket");
    } finally {
      overUnix.close();
    }
  });
});
