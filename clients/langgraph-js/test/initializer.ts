/**
 * The CheckpointerTestInitializer of @langchain/langgraph-checkpoint-validation
 * for StratadSaver. Each checkpointer acts in a tenant of its own (a tenant is
 * a separate namespace of sessions and objects in the daemon), so what one
 * instance stored is never visible to the next, as the suite requires; its
 * sessions are deleted when it is destroyed.
 *
 * Also usable with the package's CLI:
 *   npx validate-checkpointer ./test/initializer.ts
 */
import type { CheckpointSaverTestInitializer } from "@langchain/langgraph-checkpoint-validation";
import { StratadSaver } from "../src/index.js";

let created = 0;

export function freshTenant(label: string): string {
  created += 1;
  return `lgjs-${label}-${process.pid}-${Date.now().toString(36)}-${created}`;
}

export const initializer: CheckpointSaverTestInitializer<StratadSaver> = {
  checkpointerName: "@stratad/langgraph",

  createCheckpointer(): StratadSaver {
    return new StratadSaver({ tenant: freshTenant("validation") });
  },

  async destroyCheckpointer(saver: StratadSaver): Promise<void> {
    try {
      const sessions = [];
      for await (const session of saver.client.listSessions()) sessions.push(session.sessionId);
      for (const sessionId of sessions) await saver.client.deleteSession(sessionId);
    } finally {
      saver.close();
    }
  },
};

export default initializer;
