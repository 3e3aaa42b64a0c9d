/**
 * @stratad/langgraph: a LangGraph.js checkpointer that keeps every checkpoint
 * in a stratad daemon (the durable state sidecar), with the same storage
 * mapping as the Python saver `stratad.integrations.langgraph.StratadSaver`.
 *
 *     import { StratadSaver } from "@stratad/langgraph";
 *     const graph = builder.compile({ checkpointer: new StratadSaver() }); // STRATAD_ADDRESS, ...
 */
export { StratadSaver, type StratadSaverOptions } from "./saver.js";
export {
  CONTENT_TYPE_PREFIX,
  INTEGRATION_LABEL,
  INTEGRATION_VALUE,
  THREAD_LABEL,
  langgraphCheckpointId,
  sessionIdOf,
  stratadCheckpointId,
} from "./ids.js";
