// @ts-check
// Quickstart: save, load, list and fork an agent's state with stratad.
//
//   npm ci                                   # installs and builds the package
//   STRATAD_ADDRESS=127.0.0.1:50051 node examples/quickstart.mjs [SESSION_ID]
//
// The connection comes from STRATAD_ADDRESS, STRATAD_TENANT, STRATAD_TOKEN(_FILE)
// and STRATAD_TLS*, as for every stratad client. The session (default
// "quickstart-<time>") and its fork ("<SESSION_ID>-fork") stay in the daemon;
// run it again with the same SESSION_ID and it goes on where it stopped.
import { StratadClient, Reason, StratadError } from "@stratad/client";

const sessionId = process.argv[2] ?? `quickstart-${Date.now()}`;
const client = new StratadClient({ deadlineMs: 10_000 });

try {
  // 1. A session holds an agent's checkpoints. A second run finds it there.
  await client.createSession(sessionId, { labels: { agent: "quickstart" } }).catch((error) => {
    if (!(error instanceof StratadError && error.reason === Reason.ALREADY_EXISTS)) throw error;
  });

  // 2. Save two states; each becomes a checkpoint and the session's head.
  const first = await client.saveJson(sessionId, { messages: ["hi"] }, { metadata: { step: 1 } });
  const second = await client.saveJson(
    sessionId,
    { messages: ["hi", "hello!"] },
    { metadata: { step: 2 }, expectedVersion: first.version },
  );
  console.log(`saved ${first.checkpointId} (v${first.version}) and ${second.checkpointId} (v${second.version})`);

  // 3. Load the latest state.
  const { value } = await client.loadJson(sessionId);
  console.log("latest state:", JSON.stringify(value));

  // 4. List the checkpoints, newest first.
  for await (const checkpoint of client.listCheckpoints(sessionId)) {
    console.log(`checkpoint ${checkpoint.checkpointId} step=${checkpoint.metadata?.step} size=${checkpoint.size}`);
  }

  // 5. Fork a new session from the first checkpoint: it starts with that state.
  //    (The fork of a previous run is deleted first: fork IDs are unique.)
  await client.deleteSession(`${sessionId}-fork`).catch((error) => {
    if (!(error instanceof StratadError && error.reason === Reason.SESSION_NOT_FOUND)) throw error;
  });
  const fork = await client.forkSession(first.checkpointId, { newSessionId: `${sessionId}-fork` });
  const forked = await client.loadJson(fork.sessionId);
  console.log(`forked ${fork.sessionId} from ${fork.forkedFromCheckpointId}:`, JSON.stringify(forked.value));

  // 6. Errors carry a machine-readable reason: a stale expectedVersion is refused.
  try {
    await client.saveJson(sessionId, { messages: [] }, { expectedVersion: first.version });
  } catch (error) {
    if (!(error instanceof StratadError && error.reason === Reason.VERSION_CONFLICT)) throw error;
    console.log(`stale write refused: ${error.reason} ${JSON.stringify(error.metadata)}`);
  }
} finally {
  client.close();
}
