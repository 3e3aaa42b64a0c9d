/**
 * StratadClient: a thin typed wrapper over the generated stratad.api.v1
 * clients, speaking gRPC over HTTP/2 (connect-node's gRPC transport).
 *
 * Every call carries the tenant header and bearer token, has a deadline
 * (`deadlineMs`, overridable per call), is retried with backoff when it fails
 * with UNAVAILABLE (unary calls only), and fails with a typed StratadError
 * (when the client's TLS settings and the daemon's differ, an UnavailableError
 * whose message names the fix: src/diagnose.ts).
 * The session and checkpoint operations an agent needs have methods here; the
 * raw generated clients of every service (`client.sessions`, `.checkpoints`,
 * `.tasks`, `.cognitive`, `.agents`, `.profiles`, `.crystals`, `.admin`) go
 * through the same transport, so they get all of the above too.
 *
 * States are sent inline in one message: up to the daemon's
 * `max_message_bytes` (64 MiB by default). The Python SDK's chunked upload
 * (dedup against the previous checkpoint) is not implemented here.
 */
import { readFileSync } from "node:fs";
import { connect as netConnect } from "node:net";
import { connect as tlsConnect } from "node:tls";
import type * as http2 from "node:http2";
import type { JsonObject } from "@bufbuild/protobuf";
import { Code, createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { AdminService } from "./gen/stratad/api/v1/admin_pb.js";
import { AgentStateService } from "./gen/stratad/api/v1/agent_pb.js";
import {
  CheckpointService,
  type Checkpoint,
  type LoadStateResponse,
  type PauseExecutionResponse,
  type ResumeExecutionResponse,
  type SaveStateResponse,
} from "./gen/stratad/api/v1/checkpoint_pb.js";
import { CognitiveStateService } from "./gen/stratad/api/v1/cognitive_pb.js";
import { CrystalService } from "./gen/stratad/api/v1/crystal_pb.js";
import { ProfileService } from "./gen/stratad/api/v1/profile_pb.js";
import {
  SessionService,
  type Session,
  type SessionEvent,
} from "./gen/stratad/api/v1/session_pb.js";
import { TaskService } from "./gen/stratad/api/v1/task_pb.js";
import {
  callHeaders,
  parseAddress,
  resolveConnection,
  type Connection,
  type ConnectionOptions,
  type TlsOptions,
} from "./connection.js";
import { diagnoseInterceptor } from "./diagnose.js";
import { InternalError, withStratadErrors } from "./errors.js";
import {
  DEFAULT_RETRY_POLICY,
  headersInterceptor,
  retryInterceptor,
  type RetryPolicy,
} from "./interceptors.js";

export const DEFAULT_DEADLINE_MS = 30_000;
export const DEFAULT_MAX_MESSAGE_BYTES = 64 << 20;

export interface StratadClientOptions extends ConnectionOptions {
  /** Deadline of every call unless the call gives its own (default 30 s; 0 = none). */
  deadlineMs?: number;
  /** Retries of unary calls that fail with UNAVAILABLE (default: 5 attempts, 50 ms..2 s). */
  retry?: Partial<RetryPolicy>;
  /** Largest message sent or received; match the daemon's max_message_bytes (default 64 MiB). */
  maxMessageBytes?: number;
  /** Interceptors run inside the client's own (after retries, with the headers set). */
  interceptors?: Interceptor[];
}

/** Per-call options of the wrapper methods. */
export interface CallOptions {
  /** This call's deadline instead of the client's (0 = none). */
  deadlineMs?: number;
  /** Cancels the call (it fails with CanceledError). */
  signal?: AbortSignal;
}

export interface CreateSessionOptions extends CallOptions {
  labels?: Record<string, string>;
  retention?: { keepLast?: number; maxAgeSeconds?: number };
}

export interface ListOptions extends CallOptions {
  /** Items per page fetched from the daemon (the iterator follows every page). */
  pageSize?: number;
}

export interface ListSessionsOptions extends ListOptions {
  /** Only sessions whose ID starts with this prefix. */
  prefix?: string;
}

export interface SaveStateOptions extends CallOptions {
  contentType?: string;
  /** JSON metadata stored with the checkpoint (filterable in listCheckpoints). */
  metadata?: JsonObject;
  /** 0/unset = don't check; otherwise VersionConflictError unless the session is at this version. */
  expectedVersion?: bigint | number;
  /** Client-chosen ID (unique within the tenant); generated when empty. */
  checkpointId?: string;
  /** Defaults to the latest checkpoint of the namespace. */
  parentCheckpointId?: string;
  namespace?: string;
  /** Start a new line: no parent even when the namespace has checkpoints. */
  noParent?: boolean;
}

export interface LoadStateOptions extends CallOptions {
  /** A given checkpoint instead of the latest of `namespace`. */
  checkpointId?: string;
  namespace?: string;
  /** Also return the checkpoint's pending writes (in `checkpoint.pendingWrites`). */
  includeWrites?: boolean;
}

export interface ListCheckpointsOptions extends ListOptions {
  /** Only checkpoints of this namespace (all namespaces when undefined). */
  namespace?: string;
  /** Only checkpoints whose metadata contains every one of these fields. */
  metadataFilter?: JsonObject;
  /** Only checkpoints created before this one. */
  before?: string;
  includeWrites?: boolean;
}

export interface VersionedOptions extends CallOptions {
  expectedVersion?: bigint | number;
}

export interface CreateCheckpointOptions extends VersionedOptions {
  /** Defaults to "checkpoint-<version>". */
  name?: string;
  metadata?: JsonObject;
  checkpointId?: string;
}

export interface RestoreCheckpointOptions extends VersionedOptions {
  /** Make the checkpoint the session's head again. */
  makeCurrent?: boolean;
}

export interface ForkSessionOptions extends CallOptions {
  /** The new session's ID; generated when empty. */
  newSessionId?: string;
  labels?: Record<string, string>;
}

export interface PauseExecutionOptions extends VersionedOptions {
  /** Saved as a checkpoint before the session is paused. */
  state?: { data: Uint8Array | string } & Omit<SaveStateOptions, keyof CallOptions | "expectedVersion">;
}

export interface WatchSessionOptions extends CallOptions {
  /** Replay events with a version greater than this one first (0 = only new events). */
  fromVersion?: bigint | number;
}

/** A loaded JSON state: the parsed value and the response it came in. */
export interface LoadedJson<T> {
  value: T;
  state: LoadStateResponse;
}

const JSON_CONTENT_TYPE = "application/json";
const utf8 = new TextEncoder();

export class StratadClient {
  readonly connection: Connection;
  /** Raw generated clients, one per service, sharing this client's transport. */
  readonly sessions: Client<typeof SessionService>;
  readonly checkpoints: Client<typeof CheckpointService>;
  readonly tasks: Client<typeof TaskService>;
  readonly cognitive: Client<typeof CognitiveStateService>;
  readonly agents: Client<typeof AgentStateService>;
  readonly profiles: Client<typeof ProfileService>;
  readonly crystals: Client<typeof CrystalService>;
  readonly admin: Client<typeof AdminService>;
  readonly transport: Transport;
  private readonly sessionManager: Http2SessionManager;

  constructor(options: StratadClientOptions = {}) {
    this.connection = resolveConnection(options);
    const { baseUrl, nodeOptions } = dialOptions(this.connection);
    this.sessionManager = new Http2SessionManager(baseUrl, undefined, nodeOptions);
    const maxBytes = options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    const defaultDeadline = options.deadlineMs ?? DEFAULT_DEADLINE_MS;
    this.transport = createGrpcTransport({
      baseUrl,
      sessionManager: this.sessionManager,
      // connect reads a default of 0 as "already expired"; undefined is "no deadline".
      defaultTimeoutMs: defaultDeadline > 0 ? defaultDeadline : undefined,
      // Room for the message's other fields next to a state of maxBytes, as the Python SDK allows.
      readMaxBytes: maxBytes + (1 << 20),
      writeMaxBytes: maxBytes + (1 << 20),
      interceptors: [
        // Outermost: once per failed call, after its retries.
        diagnoseInterceptor(this.connection),
        retryInterceptor({ ...DEFAULT_RETRY_POLICY, ...options.retry }),
        headersInterceptor(callHeaders(this.connection)),
        ...(options.interceptors ?? []),
      ],
    });
    this.sessions = withStratadErrors(createClient(SessionService, this.transport));
    this.checkpoints = withStratadErrors(createClient(CheckpointService, this.transport));
    this.tasks = withStratadErrors(createClient(TaskService, this.transport));
    this.cognitive = withStratadErrors(createClient(CognitiveStateService, this.transport));
    this.agents = withStratadErrors(createClient(AgentStateService, this.transport));
    this.profiles = withStratadErrors(createClient(ProfileService, this.transport));
    this.crystals = withStratadErrors(createClient(CrystalService, this.transport));
    this.admin = withStratadErrors(createClient(AdminService, this.transport));
  }

  /** Closes the HTTP/2 connection; calls still open fail. */
  close(): void {
    this.sessionManager.abort();
  }

  // -- sessions ------------------------------------------------------------

  /** Creates a session (a generated ID when `sessionId` is empty). */
  async createSession(sessionId = "", options: CreateSessionOptions = {}): Promise<Session> {
    const retention = options.retention && {
      keepLast: options.retention.keepLast ?? 0,
      maxAgeSeconds: options.retention.maxAgeSeconds ?? 0,
    };
    const response = await this.sessions.createSession(
      { sessionId, labels: options.labels ?? {}, retention },
      callOptions(options),
    );
    return required(response.session, "CreateSession returned no session");
  }

  async getSession(sessionId: string, options: CallOptions = {}): Promise<Session> {
    const response = await this.sessions.getSession({ sessionId }, callOptions(options));
    return required(response.session, "GetSession returned no session");
  }

  /** The tenant's sessions ordered by ID, every page (each page is one call). */
  async *listSessions(options: ListSessionsOptions = {}): AsyncGenerator<Session> {
    let pageToken = "";
    do {
      const page = await this.sessions.listSessions(
        { pageSize: options.pageSize ?? 0, pageToken, prefix: options.prefix ?? "" },
        callOptions(options),
      );
      yield* page.sessions;
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  /** Deletes a session and its checkpoints. */
  async deleteSession(sessionId: string, options: VersionedOptions = {}): Promise<void> {
    await this.sessions.deleteSession(
      { sessionId, expectedVersion: version(options.expectedVersion) },
      callOptions(options),
    );
  }

  /**
   * The session's events in version order, as they happen. Without a
   * `deadlineMs` the stream stays open until `signal` aborts it or the
   * session is deleted.
   */
  async *watchSession(sessionId: string, options: WatchSessionOptions = {}): AsyncGenerator<SessionEvent> {
    const stream = this.sessions.watchSession(
      { sessionId, fromVersion: version(options.fromVersion) },
      { timeoutMs: options.deadlineMs ?? 0, signal: options.signal },
    );
    for await (const response of stream) {
      if (response.event) yield response.event;
    }
  }

  // -- states and checkpoints ----------------------------------------------

  /** Saves a state (bytes, or a string sent as UTF-8) as the session's new head checkpoint. */
  async saveState(
    sessionId: string,
    data: Uint8Array | string,
    options: SaveStateOptions = {},
  ): Promise<SaveStateResponse> {
    return this.checkpoints.saveState(saveRequest(sessionId, data, options), callOptions(options));
  }

  /** Saves `value` as JSON (content type application/json). */
  async saveJson(sessionId: string, value: unknown, options: SaveStateOptions = {}): Promise<SaveStateResponse> {
    const contentType = options.contentType || JSON_CONTENT_TYPE;
    return this.saveState(sessionId, JSON.stringify(value), { ...options, contentType });
  }

  /** The latest state of the session (of a namespace), or of a given checkpoint. */
  async loadState(sessionId: string, options: LoadStateOptions = {}): Promise<LoadStateResponse> {
    return this.checkpoints.loadState(
      {
        sessionId,
        checkpointId: options.checkpointId ?? "",
        namespace: options.namespace ?? "",
        includeWrites: options.includeWrites ?? false,
      },
      callOptions(options),
    );
  }

  /** Loads a state saved as JSON and parses it. */
  async loadJson<T = unknown>(sessionId: string, options: LoadStateOptions = {}): Promise<LoadedJson<T>> {
    const state = await this.loadState(sessionId, options);
    return { value: JSON.parse(new TextDecoder().decode(state.data)) as T, state };
  }

  /** The session's checkpoints, newest first, every page. */
  async *listCheckpoints(sessionId: string, options: ListCheckpointsOptions = {}): AsyncGenerator<Checkpoint> {
    let pageToken = "";
    do {
      const page = await this.checkpoints.listCheckpoints(
        {
          sessionId,
          pageSize: options.pageSize ?? 0,
          pageToken,
          namespace: options.namespace,
          metadataFilter: options.metadataFilter,
          before: options.before ?? "",
          includeWrites: options.includeWrites ?? false,
        },
        callOptions(options),
      );
      yield* page.checkpoints;
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  /** Pins the session's current state under a name (no data is copied). */
  async createCheckpoint(sessionId: string, options: CreateCheckpointOptions = {}): Promise<Checkpoint> {
    const response = await this.checkpoints.createCheckpoint(
      {
        sessionId,
        name: options.name ?? "",
        metadata: options.metadata,
        checkpointId: options.checkpointId ?? "",
        expectedVersion: version(options.expectedVersion),
      },
      callOptions(options),
    );
    return required(response.checkpoint, "CreateCheckpoint returned no checkpoint");
  }

  /** A checkpoint's state; with `makeCurrent` it becomes its session's head again. */
  async restoreCheckpoint(checkpointId: string, options: RestoreCheckpointOptions = {}): Promise<LoadStateResponse> {
    const response = await this.checkpoints.restoreCheckpoint(
      {
        checkpointId,
        makeCurrent: options.makeCurrent ?? false,
        expectedVersion: version(options.expectedVersion),
      },
      callOptions(options),
    );
    return required(response.state, "RestoreCheckpoint returned no state");
  }

  async deleteCheckpoint(checkpointId: string, options: VersionedOptions = {}): Promise<void> {
    await this.checkpoints.deleteCheckpoint(
      { checkpointId, expectedVersion: version(options.expectedVersion) },
      callOptions(options),
    );
  }

  /** A new session whose first checkpoint shares the given checkpoint's objects. */
  async forkSession(checkpointId: string, options: ForkSessionOptions = {}): Promise<Session> {
    const response = await this.checkpoints.forkSession(
      { checkpointId, newSessionId: options.newSessionId ?? "", labels: options.labels ?? {} },
      callOptions(options),
    );
    return required(response.session, "ForkSession returned no session");
  }

  /** Marks the session PAUSED, first saving `options.state` when given. */
  async pauseExecution(sessionId: string, options: PauseExecutionOptions = {}): Promise<PauseExecutionResponse> {
    const state = options.state && saveRequest(sessionId, options.state.data, options.state);
    return this.checkpoints.pauseExecution(
      { sessionId, expectedVersion: version(options.expectedVersion), state },
      callOptions(options),
    );
  }

  /** Marks a PAUSED session ACTIVE; the response carries its latest state. */
  async resumeExecution(sessionId: string, options: VersionedOptions = {}): Promise<ResumeExecutionResponse> {
    return this.checkpoints.resumeExecution(
      { sessionId, expectedVersion: version(options.expectedVersion) },
      callOptions(options),
    );
  }
}

function saveRequest(sessionId: string, data: Uint8Array | string, options: SaveStateOptions) {
  return {
    sessionId,
    data: typeof data === "string" ? utf8.encode(data) : data,
    contentType: options.contentType ?? "",
    metadata: options.metadata,
    expectedVersion: version(options.expectedVersion),
    checkpointId: options.checkpointId ?? "",
    parentCheckpointId: options.parentCheckpointId ?? "",
    namespace: options.namespace ?? "",
    noParent: options.noParent ?? false,
  };
}

function callOptions(options: CallOptions): { timeoutMs?: number; signal?: AbortSignal } {
  return { timeoutMs: options.deadlineMs, signal: options.signal };
}

function version(value: bigint | number | undefined): bigint {
  return BigInt(value ?? 0);
}

/** A response field the daemon always sets; its absence is a protocol bug, not a user error. */
function required<T>(value: T | undefined, message: string): T {
  if (value === undefined) throw new InternalError(message, { code: Code.Internal });
  return value;
}

/** The URL and HTTP/2 session options to dial a resolved connection with. */
function dialOptions(connection: Connection): {
  baseUrl: string;
  nodeOptions: http2.ClientSessionOptions | http2.SecureClientSessionOptions;
} {
  const endpoint = parseAddress(connection.address);
  const scheme = connection.tls ? "https" : "http";
  const nodeOptions: http2.SecureClientSessionOptions = connection.tls ? tlsOptions(connection.tls) : {};
  if (endpoint.kind === "unix") {
    // The authority is only a name in the request; the socket is the path.
    const tls = { ...nodeOptions };
    nodeOptions.createConnection = () =>
      connection.tls ? tlsConnect({ ...tls, path: endpoint.path }) : netConnect(endpoint.path);
    return { baseUrl: `${scheme}://localhost`, nodeOptions };
  }
  return { baseUrl: `${scheme}://${endpoint.host}:${endpoint.port}`, nodeOptions };
}

function tlsOptions(tls: TlsOptions): http2.SecureClientSessionOptions {
  const read = (path: string | undefined) => (path ? readFileSync(path) : undefined);
  return {
    ca: read(tls.caFile),
    cert: read(tls.certFile),
    key: read(tls.keyFile),
    // Node checks the certificate against servername when it is given, else the host dialed.
    servername: tls.serverName || undefined,
    ALPNProtocols: ["h2"],
  };
}
