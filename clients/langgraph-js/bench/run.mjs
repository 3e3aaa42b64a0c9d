// The node side of bench/langgraph_js.py: one run of the reference conversation
// (docs/design.md) as a LangGraph.js StateGraph with one checkpointer.
//
//   node bench/run.mjs --saver stratad|sqlite|memory --steps N --messages FILE [--db FILE]
//
// FILE holds the conversation's messages as JSON (bench/langgraph_js.py draws
// them with Python's random.Random(7), as every benchmark of the reference
// workload does). One node adds message i per super-step, so a run of N steps
// makes N+2 checkpoints and N put_writes in one invoke (LangGraph's default
// durability, "async"). Prints one JSON line: the saver, steps, the invoke's
// wall time in seconds, and for MemorySaver the serialized bytes it holds.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { Annotation, END, MemorySaver, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { SqliteSaver } from "@langchain/langgraph-checkpoint-sqlite";

import { StratadSaver } from "../dist/index.js";

const { values: args } = parseArgs({
  options: {
    saver: { type: "string" },
    steps: { type: "string" },
    messages: { type: "string" },
    db: { type: "string", default: "checkpoints.db" },
  },
});
const steps = Number(args.steps);
const messages = JSON.parse(readFileSync(args.messages, "utf8"));
if (messages.length < steps) throw new Error(`${args.messages} has ${messages.length} messages, not ${steps}`);

const State = Annotation.Root({
  ...MessagesAnnotation.spec,
  step: Annotation(),
  scratch: Annotation(),
});

function build(checkpointer) {
  return new StateGraph(State)
    .addNode("speak", (state) => {
      const i = state.messages.length;
      return { messages: [messages[i]], step: i, scratch: { tool: "search", n: i } };
    })
    .addEdge(START, "speak")
    .addConditionalEdges("speak", (state) => (state.messages.length < steps ? "speak" : END), ["speak", END])
    .compile({ checkpointer });
}

function makeSaver() {
  if (args.saver === "stratad") return new StratadSaver(); // STRATAD_ADDRESS
  if (args.saver === "sqlite") return SqliteSaver.fromConnString(args.db);
  if (args.saver === "memory") return new MemorySaver();
  throw new Error(`unknown saver ${args.saver}`);
}

/** The serialized bytes a MemorySaver holds: checkpoints, metadata and writes. */
function memoryBytes(saver) {
  let total = 0;
  for (const namespaces of Object.values(saver.storage)) {
    for (const checkpoints of Object.values(namespaces)) {
      for (const [checkpoint, metadata] of Object.values(checkpoints)) total += checkpoint.length + metadata.length;
    }
  }
  for (const writes of Object.values(saver.writes)) {
    for (const [, , value] of Object.values(writes)) total += value.length;
  }
  return total;
}

const saver = makeSaver();
try {
  const graph = build(saver);
  const config = { configurable: { thread_id: "conversation" }, recursionLimit: steps + 10 };
  const started = performance.now();
  const out = await graph.invoke({ messages: [], step: 0, scratch: {} }, config);
  const seconds = (performance.now() - started) / 1000;
  if (out.messages.length !== steps) throw new Error(`${out.messages.length} messages, not ${steps}`);
  const latest = await saver.getTuple({ configurable: { thread_id: "conversation", checkpoint_ns: "" } });
  if (latest?.checkpoint.channel_values.messages.length !== steps) throw new Error("the latest checkpoint is short");
  const result = { saver: args.saver, steps, seconds };
  if (args.saver === "memory") result.stored = memoryBytes(saver);
  console.log(JSON.stringify(result));
} finally {
  if (args.saver === "stratad") saver.close();
  if (args.saver === "sqlite") saver.db.close();
}
