// Deadlines and retries against sockets that misbehave on purpose: a server
// that accepts and never answers, and one that drops every connection.
import assert from "node:assert/strict";
import { createServer, type Server, type Socket } from "node:net";
import type { Interceptor } from "@connectrpc/connect";
import { after, before, describe, test } from "node:test";
import { CanceledError, DeadlineExceededError, StratadClient, UnavailableError } from "../src/index.js";

function listen(onConnection: (socket: Socket) => void): Promise<{ server: Server; address: string }> {
  return new Promise((resolve) => {
    const server = createServer(onConnection);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as { port: number };
      resolve({ server, address: `127.0.0.1:${port}` });
    });
  });
}

describe("deadlines", () => {
  const held: Socket[] = [];
  let silent: { server: Server; address: string };
  before(async () => {
    silent = await listen((socket) => held.push(socket)); // accepts, never answers
  });
  after(() => {
    held.forEach((socket) => socket.destroy());
    silent.server.close();
  });

  test("a call to a daemon that never answers fails with DeadlineExceededError at its deadline", async () => {
    const client = new StratadClient({ address: silent.address, env: {}, deadlineMs: 200 });
    try {
      await assert.rejects(client.getSession("s"), (error: unknown) => {
        assert.ok(error instanceof DeadlineExceededError, String(error));
        assert.equal(error.reason, "DEADLINE_EXCEEDED");
        return true;
      });
      // The per-call deadline overrides the client's.
      await assert.rejects(client.listSessions({ deadlineMs: 50 }).next(), DeadlineExceededError);
    } finally {
      client.close();
    }
  });

  test("a call the caller aborts fails with CanceledError and is not retried", async () => {
    let attempts = 0;
    const countAttempts: Interceptor = (next) => (request) => {
      attempts += 1;
      return next(request);
    };
    const client = new StratadClient({ address: silent.address, env: {}, interceptors: [countAttempts] });
    try {
      const controller = new AbortController();
      const call = client.getSession("s", { signal: controller.signal });
      setTimeout(() => controller.abort(), 50);
      await assert.rejects(call, CanceledError);
      assert.equal(attempts, 1);
    } finally {
      client.close();
    }
  });
});

describe("retries", () => {
  let connections = 0;
  let probes = 0;
  let dropping: { server: Server; address: string };
  before(async () => {
    dropping = await listen((socket) => {
      socket.on("error", () => {});
      socket.once("data", (chunk: Buffer) => {
        // A call's connection opens with the HTTP/2 preface; a TLS ClientHello
        // (0x16, a handshake record) is the probe of a failed call (src/diagnose.ts).
        if (chunk[0] === 0x16) probes += 1;
        else connections += 1;
        socket.destroy(); // every attempt fails before reaching a daemon: UNAVAILABLE
      });
    });
  });
  after(() => dropping.server.close());

  test("UNAVAILABLE is retried maxAttempts times, then thrown as UnavailableError", async () => {
    const client = new StratadClient({
      address: dropping.address,
      env: {},
      retry: { maxAttempts: 3, initialBackoffMs: 10 },
    });
    try {
      connections = 0;
      probes = 0;
      await assert.rejects(client.getSession("s"), UnavailableError);
      assert.equal(connections, 3);
      assert.equal(probes, 1); // once per failed call, not per attempt
    } finally {
      client.close();
    }
  });

  test("a port nobody listens on is UnavailableError", async () => {
    const closed = await listen(() => {});
    await new Promise((resolve) => closed.server.close(resolve));
    const client = new StratadClient({ address: closed.address, env: {}, retry: { initialBackoffMs: 1 } });
    try {
      await assert.rejects(client.getSession("s"), UnavailableError);
    } finally {
      client.close();
    }
  });

  test("retries stop at the deadline: the backoff never outlives the call", async () => {
    const client = new StratadClient({
      address: dropping.address,
      env: {},
      deadlineMs: 300,
      retry: { maxAttempts: 100, initialBackoffMs: 60_000, maxBackoffMs: 60_000 },
    });
    try {
      connections = 0;
      await assert.rejects(client.getSession("s"), DeadlineExceededError);
      assert.ok(connections >= 1 && connections < 100, `connections ${connections}`);
    } finally {
      client.close();
    }
  });

  test("maxAttempts 1 turns retries off", async () => {
    const client = new StratadClient({ address: dropping.address, env: {}, retry: { maxAttempts: 1 } });
    try {
      connections = 0;
      probes = 0;
      await assert.rejects(client.getSession("s"), UnavailableError);
      assert.equal(connections, 1);
      assert.equal(probes, 1);
    } finally {
      client.close();
    }
  });
});
