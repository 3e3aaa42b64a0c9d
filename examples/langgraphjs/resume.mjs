// A LangGraph.js run that survives being killed: StratadSaver keeps its checkpoints.
//
// A small StateGraph writes a report in N steps (one message per step, a short
// sleep standing in for an LLM call). Every step is checkpointed in a stratad
// daemon. Kill the process at any point (SIGKILL, OOM, a crashed container)
// and start it again with the same thread ID: the new process finds the
// thread's latest checkpoint in the sidecar and carries on from there, without
// redoing the finished steps.
//
//   stratad serve &                                     # the sidecar (127.0.0.1:50051)
//   node resume.mjs --thread report-1 --steps 12        # kill it mid-run (Ctrl-C, kill -9) ...
//   node resume.mjs --thread report-1 --steps 12        # ... and it resumes
//
// The daemon's address comes from STRATAD_ADDRESS (default 127.0.0.1:50051).
import { parseArgs } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";

import { END, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { StratadSaver } from "@stratad/langgraph";

const { values: args } = parseArgs({
  options: {
    thread: { type: "string", default: "report-1" },
    steps: { type: "string", default: "12" },
    delay: { type: "string", default: "0.2" },
  },
});
const steps = Number(args.steps);
const delayMs = Number(args.delay) * 1000;

function build(checkpointer) {
  return new StateGraph(MessagesAnnotation)
    .addNode("write", async (state) => {
      const i = state.messages.length;
      await sleep(delayMs); // the slow part: an LLM call, a tool
      console.log(`step ${i}`);
      return { messages: [{ role: i % 2 === 0 ? "user" : "assistant", content: `section ${i}` }] };
    })
    .addEdge(START, "write")
    .addConditionalEdges("write", (state) => (state.messages.length < steps ? "write" : END), ["write", END])
    .compile({ checkpointer });
}

const checkpointer = new StratadSaver(); // was: new MemorySaver() / SqliteSaver.fromConnString(...)
try {
  const graph = build(checkpointer);
  const config = { configurable: { thread_id: args.thread }, recursionLimit: steps + 10 };
  const state = await graph.getState(config);
  let out;
  if (state.next.length > 0) {
    // A run was interrupted: continue from its last checkpoint.
    console.log(`resuming at ${state.values.messages.length} messages`);
    out = await graph.invoke(null, config);
  } else if (state.values.messages?.length) {
    console.log("already finished");
    out = state.values;
  } else {
    console.log("starting");
    out = await graph.invoke({ messages: [] }, config);
  }
  console.log(`done: ${out.messages.length} messages`);
} finally {
  checkpointer.close();
}
