/**
 * @stratad/client: the TypeScript/Node.js client of stratad.
 *
 * `StratadClient` wraps the session and checkpoint operations; the generated
 * messages and service descriptors of every stratad.api.v1 service are
 * exported too (and importable from "@stratad/client/gen/...").
 */
export {
  StratadClient,
  DEFAULT_DEADLINE_MS,
  DEFAULT_MAX_MESSAGE_BYTES,
  type CallOptions,
  type CreateCheckpointOptions,
  type CreateSessionOptions,
  type ForkSessionOptions,
  type ListCheckpointsOptions,
  type ListOptions,
  type ListSessionsOptions,
  type LoadedJson,
  type LoadStateOptions,
  type PauseExecutionOptions,
  type RestoreCheckpointOptions,
  type SaveStateOptions,
  type StratadClientOptions,
  type VersionedOptions,
  type WatchSessionOptions,
} from "./client.js";
export * from "./connection.js";
export * from "./errors.js";
export { DEFAULT_RETRY_POLICY, type RetryPolicy } from "./interceptors.js";
export { Code } from "@connectrpc/connect";

export * from "./gen/stratad/api/v1/admin_pb.js";
export * from "./gen/stratad/api/v1/agent_pb.js";
export * from "./gen/stratad/api/v1/checkpoint_pb.js";
export * from "./gen/stratad/api/v1/cognitive_pb.js";
export * from "./gen/stratad/api/v1/common_pb.js";
export * from "./gen/stratad/api/v1/crystal_pb.js";
export * from "./gen/stratad/api/v1/profile_pb.js";
export * from "./gen/stratad/api/v1/session_pb.js";
export * from "./gen/stratad/api/v1/task_pb.js";
