// Human in the loop with LangGraph.js and stratad: a graph pauses for approval
// with interrupt(), its process exits, and a later process (a webhook, a CLI,
// another pod) answers it with Command({ resume }). Nothing is kept in the
// first process: the pending question is a checkpoint in the sidecar.
//
//   stratad serve &                                          # the sidecar (127.0.0.1:50051)
//   node interrupt.mjs ask --thread refund-17                # drafts a reply, asks, exits
//   node interrupt.mjs answer --thread refund-17 --answer yes   # a new process resumes it
//   node interrupt.mjs show --thread refund-17               # the thread's checkpoints
//
// The daemon's address comes from STRATAD_ADDRESS (default 127.0.0.1:50051).
import { parseArgs } from "node:util";

import { Annotation, Command, END, MessagesAnnotation, START, StateGraph, interrupt } from "@langchain/langgraph";
import { StratadSaver } from "@stratad/langgraph";

const { positionals, values: args } = parseArgs({
  allowPositionals: true,
  options: {
    thread: { type: "string", default: "refund-17" },
    answer: { type: "string", default: "yes" },
  },
});
const command = positionals[0] ?? "ask";

const Ticket = Annotation.Root({
  ...MessagesAnnotation.spec,
  approved: Annotation(),
});

function build(checkpointer) {
  return new StateGraph(Ticket)
    .addNode("draft", (state) => ({
      messages: [{ role: "assistant", content: `Draft: refund approved for "${state.messages[0].content}".` }],
    }))
    .addNode("approve", () => {
      // Pauses the run; the value returned is the answer given with Command({ resume }).
      const answer = interrupt({ question: "Send this reply?", options: ["yes", "no"] });
      return { approved: answer === "yes", messages: [{ role: "user", content: `reviewer: ${answer}` }] };
    })
    .addNode("send", (state) => ({
      messages: [{ role: "assistant", content: state.approved ? "Reply sent." : "Reply discarded." }],
    }))
    .addEdge(START, "draft")
    .addEdge("draft", "approve")
    .addEdge("approve", "send")
    .addEdge("send", END)
    .compile({ checkpointer });
}

const checkpointer = new StratadSaver();
try {
  const graph = build(checkpointer);
  const config = { configurable: { thread_id: args.thread } };
  if (command === "ask") {
    const out = await graph.invoke({ messages: [{ role: "user", content: "order 1234 arrived broken" }] }, config);
    for (const pending of out.__interrupt__ ?? []) console.log(`waiting for an answer: ${JSON.stringify(pending.value)}`);
  } else if (command === "answer") {
    const paused = await graph.getState(config);
    if (paused.next.length === 0) {
      console.log(`thread ${args.thread} is not waiting for an answer`);
      process.exitCode = 1;
    } else {
      console.log(`resuming ${args.thread} at ${paused.next.join(", ")} with ${JSON.stringify(args.answer)}`);
      const out = await graph.invoke(new Command({ resume: args.answer }), config);
      for (const message of out.messages) console.log(`${message.getType()}: ${message.content}`);
    }
  } else if (command === "show") {
    for await (const snapshot of graph.getStateHistory(config)) {
      const next = snapshot.next.length ? ` next=${snapshot.next.join(",")}` : "";
      console.log(`step ${snapshot.metadata?.step} ${snapshot.config.configurable?.checkpoint_id}${next}`);
    }
  } else {
    throw new Error(`unknown command ${command}: ask, answer or show`);
  }
} finally {
  checkpointer.close();
}
