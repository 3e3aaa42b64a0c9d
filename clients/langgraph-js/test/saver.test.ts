/**
 * StratadSaver beyond the validation suite, against a real daemon: the storage
 * mapping the Python saver shares, real StateGraph runs (interrupts, subgraphs,
 * a new saver resuming), the ordering LangGraph relies on, the extra
 * operations, and how daemon errors reach LangGraph.
 */
import { randomBytes } from "node:crypto";

import { HumanMessage } from "@langchain/core/messages";
import { emptyCheckpoint, uuid6, type Checkpoint } from "@langchain/langgraph-checkpoint";
import { Annotation, Command, END, INTERRUPT, MessagesAnnotation, START, StateGraph, interrupt } from "@langchain/langgraph";
import { AlreadyExistsError, StratadClient, UnavailableError } from "@stratad/client";

import {
  CONTENT_TYPE_PREFIX,
  StratadSaver,
  langgraphCheckpointId,
  sessionIdOf,
  stratadCheckpointId,
} from "../src/index.js";
import { decodeLayout } from "../src/layout.js";
import { freshTenant } from "./initializer.js";

const savers: StratadSaver[] = [];

function newSaver(tenant: string): StratadSaver {
  const saver = new StratadSaver({ tenant });
  savers.push(saver);
  return saver;
}

afterAll(() => {
  for (const saver of savers) saver.close();
});

const meta = { source: "loop" as const, step: 0, parents: {} };

function checkpointWith(values: Record<string, unknown>): Checkpoint {
  const versions = Object.fromEntries(Object.keys(values).map((k) => [k, 1]));
  return { ...emptyCheckpoint(), id: uuid6(3), channel_values: values, channel_versions: versions };
}

describe("ids", () => {
  // Computed by stratad.integrations.langgraph (session_id_of, stratad_checkpoint_id).
  it("are the Python saver's", () => {
    expect(sessionIdOf("chat-42")).toBe("chat-42");
    expect(sessionIdOf("chat-42", "p.")).toBe("p.chat-42");
    expect(sessionIdOf("user 42/ü")).toBe("lg-da22c941dbb8cfcbc5c4c5aa7742c3e3");
    expect(sessionIdOf("a".repeat(129))).toBe("lg-68b7bafbad5055c4ebe6eb170a0f8524");
    expect(sessionIdOf("a".repeat(128), "p.")).toBe("p.lg-1271d28e731afb57bdfba6bdaf3501be");
    expect(sessionIdOf("-x")).toBe("lg-d1adfb26593a129a1f5901c059a110a6");
    expect(sessionIdOf("-x", "p.")).toBe("p.-x");
    const id = "1ef4f797-8335-6428-8001-8a1503f9b875";
    expect(stratadCheckpointId("chat-42", "", id)).toBe(`${id}.18f8752988304ad5`);
    expect(stratadCheckpointId("chat-42", "sub:6f1c|inner:9", id)).toBe(`${id}.0a7050cf6033054f`);
    expect(stratadCheckpointId("t", "", "x".repeat(111))).toBe(`${"x".repeat(111)}.c921839ae11d5b20`);
    expect(stratadCheckpointId("t", "ns", "id with space")).toBe("lgx-c6411e98ee96dcd22dd18a7c07e262a6");
    expect(langgraphCheckpointId(`${id}.18f8752988304ad5`)).toBe(id);
    expect(langgraphCheckpointId("lgx-c6411e98ee96dcd22dd18a7c07e262a6")).toBeUndefined();
  });
});

describe("storage mapping", () => {
  it("keeps a thread as a labelled session of stratad checkpoints", async () => {
    const saver = newSaver(freshTenant("mapping"));
    const thread = "thread with spaces/and:slashes";
    const root = { configurable: { thread_id: thread, checkpoint_ns: "" } };
    const first = checkpointWith({ messages: ["hi"] });
    const c1 = await saver.put(root, first, { ...meta, step: -1, source: "input" }, { messages: 1 });
    await saver.putWrites(c1, [["messages", ["hello"]], [INTERRUPT, { value: "ask" }]], "task-1", "~1");
    const second = { ...checkpointWith({ messages: ["hi", "hello"] }), channel_versions: { messages: 2 } };
    const c2 = await saver.put(c1, second, { ...meta, run_id: "run-7" } as typeof meta, { messages: 2 });

    const sessionId = sessionIdOf(thread);
    expect(sessionId).toMatch(/^lg-[0-9a-f]{32}$/);
    const session = await saver.client.getSession(sessionId);
    expect(session.labels).toEqual({ "stratad.integration": "langgraph", "langgraph.thread_id": thread });
    const listed = [];
    for await (const cp of saver.client.listCheckpoints(sessionId, { includeWrites: true })) listed.push(cp);
    expect(listed.map((cp) => cp.checkpointId)).toEqual([
      stratadCheckpointId(thread, "", second.id),
      stratadCheckpointId(thread, "", first.id),
    ]);
    expect(listed[0]!.parentCheckpointId).toBe(listed[1]!.checkpointId);
    expect(listed[1]!.parentCheckpointId).toBe("");
    expect(listed[0]!.contentType).toBe(`${CONTENT_TYPE_PREFIX}json`);
    expect(listed[0]!.metadata).toEqual({ source: "loop", step: 0, parents: {}, run_id: "run-7" });
    // INTERRUPT is a special channel: WRITES_IDX_MAP gives it a negative idx.
    expect(listed[1]!.pendingWrites.map((w) => [w.taskId, w.taskPath, w.idx, w.channel, w.type])).toEqual([
      ["task-1", "~1", -3, "__interrupt__", "json"],
      ["task-1", "~1", 0, "messages", "json"],
    ]);
    // The state: the layout the Python saver writes, its trailer's checkpoint, metadata and parent.
    const head = await saver.client.loadState(sessionId);
    expect(new TextDecoder().decode(head.data.subarray(0, 5))).toBe("SLG2\n");
    const payload = await decodeLayout(head.data, (type, data) => saver.serde.loadsTyped(type, data));
    expect(payload.parent_checkpoint_id).toBe(first.id);
    expect(payload.checkpoint.channel_values).toEqual({ messages: ["hi", "hello"] });

    const threads = [];
    for await (const tuple of saver.list({ configurable: {} })) threads.push(tuple.config.configurable?.thread_id);
    expect(threads).toEqual([thread, thread]);
    expect(c2.configurable?.checkpoint_id).toBe(second.id);
  });

  it("carries forward the values of unchanged channels, also in a new process", async () => {
    const tenant = freshTenant("carry");
    const saver = newSaver(tenant);
    const root = { configurable: { thread_id: "carry", checkpoint_ns: "" } };
    const big = randomBytes(48 << 10).toString("base64"); // 64 KiB that zstd cannot shrink
    const c1 = await saver.put(root, checkpointWith({ big, n: 1 }), meta, { big: 1, n: 1 });
    // Another saver (another process) never saw c1: it keeps every value it is given.
    const other = newSaver(tenant);
    const second = { ...checkpointWith({ big, n: 2 }), channel_versions: { big: 1, n: 2 } };
    const c2 = await other.put(c1, second, { ...meta, step: 1 }, { n: 2 });
    expect((await saver.getTuple(c2))?.checkpoint.channel_values).toEqual({ big, n: 2 });
    // The daemon's chunking stored the repeated value once: the second state added a fraction of the first.
    const [latest, earliest] = await collect(saver.client.listCheckpoints("carry"));
    expect(Number(earliest!.storedBytes)).toBeGreaterThan(48 << 10);
    expect(Number(latest!.storedBytes)).toBeLessThan(Number(earliest!.storedBytes) / 4);
  });
});

describe("layouts", () => {
  it("reads both layouts, whichever it writes", async () => {
    const tenant = freshTenant("layouts");
    const pieces = newSaver(tenant);
    const payload = new StratadSaver({ tenant, layout: "payload" });
    savers.push(payload);
    const values = { messages: ["a", { role: "user", content: "b" }], count: 2, raw: new Uint8Array([1, 2]) };
    let config = { configurable: { thread_id: "mixed", checkpoint_ns: "" } } as Record<string, any>;
    for (const [i, saver] of [pieces, payload, pieces].entries()) {
      const checkpoint = { ...checkpointWith(values), channel_versions: { messages: i + 1, count: 1, raw: 1 } };
      config = await saver.put(config, checkpoint, { ...meta, step: i }, { messages: i + 1, count: 1, raw: 1 });
    }
    const states = await collect(pieces.client.listCheckpoints("mixed"));
    const kinds = [];
    for (const cp of states) {
      const { data } = await pieces.client.loadState("mixed", { checkpointId: cp.checkpointId });
      kinds.push(new TextDecoder().decode(data.subarray(0, 4)));
    }
    expect(kinds).toEqual(["SLG2", "{\"ch", "SLG2"]);
    for (const saver of [pieces, payload]) {
      const tuples = await collect(saver.list({ configurable: { thread_id: "mixed" } }));
      expect(tuples.map((t) => t.metadata?.step)).toEqual([2, 1, 0]);
      for (const t of tuples) expect(t.checkpoint.channel_values).toEqual(values);
    }
  });

  it("serializes again what a task wrote, even the same object", async () => {
    const saver = newSaver(freshTenant("dirty"));
    const shared = { role: "user", content: "v1" };
    let config = { configurable: { thread_id: "dirty", checkpoint_ns: "" } } as Record<string, any>;
    const put = async (step: number) => {
      const checkpoint = { ...checkpointWith({ messages: [shared] }), channel_versions: { messages: step + 1 } };
      config = await saver.put(config, checkpoint, { ...meta, step }, { messages: step + 1 });
    };
    await put(0);
    shared.content = "v2"; // changed in place, then written by a task
    await saver.putWrites(config, [["messages", [shared]]], "task");
    await put(1);
    const latest = await saver.getTuple({ configurable: { thread_id: "dirty" } });
    expect(latest?.checkpoint.channel_values).toEqual({ messages: [{ role: "user", content: "v2" }] });
  });
});

describe("StateGraph", () => {
  const Steps = Annotation.Root({
    ...MessagesAnnotation.spec,
    approved: Annotation<boolean | undefined>(),
  });

  function approvalGraph(saver: StratadSaver) {
    return new StateGraph(Steps)
      .addNode("draft", () => ({ messages: [{ role: "assistant", content: "draft 1" }] }))
      .addNode("review", () => {
        const answer = interrupt({ question: "publish draft 1?" }) as string;
        return { approved: answer === "yes", messages: [{ role: "user", content: answer }] };
      })
      .addNode("publish", (state) => ({
        messages: [{ role: "assistant", content: state.approved ? "published" : "discarded" }],
      }))
      .addEdge(START, "draft")
      .addEdge("draft", "review")
      .addEdge("review", "publish")
      .addEdge("publish", END)
      .compile({ checkpointer: saver });
  }

  it("interrupts, and a new saver resumes it with Command({ resume })", async () => {
    const tenant = freshTenant("graph");
    const config = { configurable: { thread_id: "review-1" } };
    const first = await approvalGraph(newSaver(tenant)).invoke({ messages: [new HumanMessage("write it")] }, config);
    expect((first as { __interrupt__?: { value: unknown }[] }).__interrupt__?.[0]?.value).toEqual({ question: "publish draft 1?" });

    const graph = approvalGraph(newSaver(tenant)); // as a new process would
    const paused = await graph.getState(config);
    expect(paused.next).toEqual(["review"]);
    expect(paused.tasks[0]?.interrupts[0]?.value).toEqual({ question: "publish draft 1?" });
    const done = await graph.invoke(new Command({ resume: "yes" }), config);
    expect(done.messages.map((m) => m.content)).toEqual(["write it", "draft 1", "yes", "published"]);
    expect(done.approved).toBe(true);

    const history = await collect(graph.getStateHistory(config));
    const stored = await collect(newSaver(tenant).client.listCheckpoints("review-1"));
    expect(history.length).toBe(stored.length);
    expect(history.map((s) => s.metadata?.step)).toEqual([3, 2, 1, 0, -1]);
  });

  it("keeps a subgraph's checkpoints in its namespace", async () => {
    const tenant = freshTenant("subgraph");
    const saver = newSaver(tenant);
    const inner = new StateGraph(MessagesAnnotation)
      .addNode("ask", () => {
        const answer = interrupt("inner question") as string;
        return { messages: [{ role: "user", content: answer }] };
      })
      .addEdge(START, "ask")
      .compile();
    const outer = new StateGraph(MessagesAnnotation)
      .addNode("inner", inner)
      .addEdge(START, "inner")
      .compile({ checkpointer: saver });
    const config = { configurable: { thread_id: "nested" } };
    await outer.invoke({ messages: [new HumanMessage("start")] }, config);
    const namespaces = new Set((await collect(saver.client.listCheckpoints("nested"))).map((c) => c.namespace));
    expect([...namespaces].some((ns) => ns.startsWith("inner:"))).toBe(true);
    const state = await outer.getState(config, { subgraphs: true });
    expect(state.tasks[0]?.state).toBeDefined();
    const done = await outer.invoke(new Command({ resume: "answer" }), config);
    expect(done.messages.map((m) => m.content)).toEqual(["start", "answer"]);
  });

  it("updateState forks from an earlier checkpoint", async () => {
    const saver = newSaver(freshTenant("fork"));
    const graph = new StateGraph(MessagesAnnotation)
      .addNode("echo", (s) => ({ messages: [{ role: "assistant", content: `echo ${s.messages.length}` }] }))
      .addEdge(START, "echo")
      .compile({ checkpointer: saver });
    const config = { configurable: { thread_id: "forked" } };
    await graph.invoke({ messages: [new HumanMessage("a")] }, config);
    await graph.invoke({ messages: [new HumanMessage("b")] }, config);
    const history = await collect(graph.getStateHistory(config));
    const early = history.find((s) => s.values.messages?.length === 2)!;
    const forked = await graph.updateState(early.config, { messages: [new HumanMessage("c")] });
    const state = await graph.getState(forked);
    expect(state.values.messages.map((m: { content: unknown }) => m.content)).toEqual(["a", "echo 1", "c"]);
    expect(state.parentConfig?.configurable?.checkpoint_id).toBe(early.config.configurable?.checkpoint_id);
  });
});

describe("ordering", () => {
  it("waits for the put of a checkpoint whose writes arrive first", async () => {
    // LangGraph chains its puts but sends a step's writes at once.
    const saver = newSaver(freshTenant("order"));
    const checkpoint = checkpointWith({});
    const config = { configurable: { thread_id: "early", checkpoint_ns: "", checkpoint_id: checkpoint.id } };
    const writes = saver.putWrites(config, [["animals", "dog"]], "task");
    await new Promise((resolve) => setTimeout(resolve, 50));
    await saver.put({ configurable: { thread_id: "early" } }, checkpoint, meta, {});
    await writes;
    expect((await saver.getTuple(config))?.pendingWrites).toEqual([["task", "animals", "dog"]]);
  });
});

describe("beyond BaseCheckpointSaver", () => {
  async function thread(saver: StratadSaver, threadId: string, runs: string[]) {
    let config = { configurable: { thread_id: threadId, checkpoint_ns: "" } } as Record<string, any>;
    for (const [step, runId] of runs.entries()) {
      config = await saver.put(config, checkpointWith({ step }), { ...meta, step, run_id: runId } as typeof meta, { step: 1 });
    }
  }

  it("deleteForRuns, copyThread and prune", async () => {
    const saver = newSaver(freshTenant("extras"));
    await thread(saver, "a", ["r1", "r1", "r2"]);
    await thread(saver, "b", ["r2", "r3"]);
    await saver.deleteForRuns(["r2"]);
    const steps = async (t: string) =>
      (await collect(saver.list({ configurable: { thread_id: t } }))).map((x) => x.metadata?.step);
    expect(await steps("a")).toEqual([1, 0]);
    expect(await steps("b")).toEqual([1]);

    await saver.copyThread("a", "a-copy");
    const copied = await collect(saver.list({ configurable: { thread_id: "a-copy" } }));
    expect(copied.map((x) => x.metadata?.step)).toEqual([1, 0]);
    expect(copied[0]?.parentConfig?.configurable?.thread_id).toBe("a-copy");
    expect((await saver.client.getSession("a-copy")).labels["langgraph.thread_id"]).toBe("a-copy");

    await saver.prune(["a", "b"], { strategy: "keep_latest" });
    expect(await steps("a")).toEqual([1]);
    await saver.prune(["a-copy"], { strategy: "delete" });
    expect(await steps("a-copy")).toEqual([]);
    await saver.deleteThread("a");
    await saver.deleteThread("never-existed");
    expect(await saver.getTuple({ configurable: { thread_id: "a" } })).toBeUndefined();
  });
});

describe("errors", () => {
  it("a put the daemon already took is not an error; another checkpoint under its ID is", async () => {
    const saver = newSaver(freshTenant("errors"));
    const checkpoint = checkpointWith({ n: 1 });
    const root = { configurable: { thread_id: "dup", checkpoint_ns: "" } };
    await saver.put(root, checkpoint, meta, { n: 1 });
    await saver.put(root, checkpoint, meta, { n: 1 }); // a retry of the same save
    await expect(saver.put(root, checkpoint, { ...meta, step: 5 }, { n: 1 })).rejects.toBeInstanceOf(
      AlreadyExistsError,
    );
  });

  it("an unreachable daemon fails with UnavailableError", async () => {
    const saver = new StratadSaver({ address: "127.0.0.1:9", retry: { maxAttempts: 2, initialBackoffMs: 10 }, deadlineMs: 2000 });
    try {
      await expect(saver.getTuple({ configurable: { thread_id: "t" } })).rejects.toBeInstanceOf(UnavailableError);
      await expect(saver.put({ configurable: { thread_id: "t" } }, emptyCheckpoint(), meta, {})).rejects.toBeInstanceOf(
        UnavailableError,
      );
    } finally {
      saver.close();
    }
  });

  it("a saver given a client leaves it open", async () => {
    const client = new StratadClient({ tenant: freshTenant("client") });
    const saver = new StratadSaver({ client });
    await saver.put({ configurable: { thread_id: "own" } }, emptyCheckpoint(), meta, {});
    saver.close();
    expect((await client.getSession("own")).checkpointCount).toBe(1);
    client.close();
  });
});

async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}
