/**
 * StratadSaver: a LangGraph.js checkpointer (`BaseCheckpointSaver`) that keeps
 * every checkpoint in a stratad daemon, with the storage mapping of the Python
 * saver (`stratad.integrations.langgraph.StratadSaver`, docs/langgraph.md):
 *
 * - a thread is a session (`sessionIdOf`), labelled `stratad.integration=langgraph`
 *   and `langgraph.thread_id=<thread>`;
 * - `checkpoint_ns` is the stratad checkpoint's namespace;
 * - a checkpoint is the stratad checkpoint `stratadCheckpointId(thread, ns, id)`,
 *   its LangGraph parent the stratad parent (none: saved with `noParent`);
 * - the checkpoint is the state's bytes, content type
 *   `application/vnd.langgraph.checkpoint+<serde type>`, in the layout the
 *   Python saver writes (src/layout.ts): list elements (messages) one by one,
 *   then the other channels, then the rest (IDs, versions, metadata, parent), so
 *   a growing conversation grows the state at its end and the daemon's
 *   content-defined chunking and delta frames store what a step added; or, with
 *   `layout: "payload"`, one dump of {checkpoint, metadata, parent_checkpoint_id}.
 *   The metadata is also the checkpoint's metadata Struct, which
 *   `list({ filter })` matches on in the daemon;
 * - pending writes are stratad pending writes (PutWrites), keyed by
 *   (task_id, idx) with LangGraph's WRITES_IDX_MAP for special channels, and
 *   come back in (task_path, task_id, idx) order.
 *
 * Channel values: a checkpoint stores the values of the channels in
 * `newVersions` and those its parent stored (carried forward, as the SQL savers'
 * blob tables do by version), so every stored state is a whole checkpoint that
 * the Python saver reads as well.
 */
import type { RunnableConfig } from "@langchain/core/runnables";
import {
  BaseCheckpointSaver,
  TASKS,
  WRITES_IDX_MAP,
  copyCheckpoint,
  getCheckpointId,
  maxChannelVersion,
  type ChannelVersions,
  type Checkpoint,
  type CheckpointListOptions,
  type CheckpointMetadata,
  type CheckpointPendingWrite,
  type CheckpointTuple,
  type PendingWrite,
  type SerializerProtocol,
} from "@langchain/langgraph-checkpoint";
import {
  AlreadyExistsError,
  NotFoundError,
  PruneStrategy,
  Reason,
  StratadClient,
  type Checkpoint as StratadCheckpoint,
  type LoadStateResponse,
  type StratadClientOptions,
} from "@stratad/client";

import {
  CONTENT_TYPE_PREFIX,
  INTEGRATION_LABEL,
  INTEGRATION_VALUE,
  THREAD_LABEL,
  langgraphCheckpointId,
  sessionIdOf,
  stratadCheckpointId,
} from "./ids.js";
import { LayoutEncoder, decodeLayout, isLayout, type Payload } from "./layout.js";
import { loadsPythonMsgpack } from "./python.js";

type JsonObject = { [key: string]: JsonValue };
type JsonValue = string | number | boolean | null | JsonValue[] | JsonObject;

export interface StratadSaverOptions extends StratadClientOptions {
  /** A client to use instead of one made from the options (it is not closed by `close()`). */
  client?: StratadClient;
  /** LangGraph's serializer (default: JsonPlusSerializer). */
  serde?: SerializerProtocol;
  /** Prepended to thread IDs to form session IDs. */
  sessionPrefix?: string;
  /**
   * How a checkpoint is laid out in its state: "pieces" (the default: list
   * elements, such as messages, one by one, then the other channels, then the
   * rest, so a growing conversation grows the state at its end; src/layout.ts),
   * or "payload" (one dump of the whole checkpoint, as savers before the
   * layout wrote it). Both are read either way, by this saver and the Python one.
   */
  layout?: "pieces" | "payload";
  /**
   * Memory for the serialized pieces of the last checkpoint of each thread, so
   * a put serializes only what changed (default 128 MiB; 0: none).
   */
  cacheBytes?: number;
}

/** Items per ListCheckpoints page when there is no limit. */
const PAGE = 100;
/** Metadata filters per DeleteCheckpoints call. */
const FILTERS_PER_CALL = 1000;
/** How many checkpoints' stored channel sets are remembered (for carrying values forward). */
const REMEMBERED = 4096;

export class StratadSaver extends BaseCheckpointSaver {
  readonly client: StratadClient;
  readonly sessionPrefix: string;
  readonly layout: "pieces" | "payload";
  private readonly encoder: LayoutEncoder;
  private readonly ownClient: boolean;
  private readonly deadlineMs: number;
  /** Stratad checkpoint ID -> the channels its stored state has a value of. */
  private readonly storedChannels = new Bounded<Set<string>>(REMEMBERED);
  /** Stratad checkpoint ID -> settles when this saver's put of it has finished. */
  private readonly landed = new Bounded<Landing>(REMEMBERED);
  /** Session -> the puts into it that are under way. */
  private readonly saving = new Map<string, Set<Landing>>();

  constructor(options: StratadSaverOptions = {}) {
    super(options.serde);
    const { client, serde: _serde, sessionPrefix, layout, cacheBytes, ...clientOptions } = options;
    if (layout !== undefined && layout !== "pieces" && layout !== "payload") {
      throw new Error(`layout must be "pieces" or "payload", not ${JSON.stringify(layout)}`);
    }
    this.client = client ?? new StratadClient(clientOptions);
    this.ownClient = client === undefined;
    this.sessionPrefix = sessionPrefix ?? "";
    this.layout = layout ?? "pieces";
    this.encoder = new LayoutEncoder((value) => this.serde.dumpsTyped(value), cacheBytes ?? 128 << 20);
    this.deadlineMs = options.deadlineMs ?? 30_000;
  }

  /** Closes the client this saver made (not one it was given). */
  close(): void {
    if (this.ownClient) this.client.close();
  }

  // -- reading -------------------------------------------------------------

  override async getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined> {
    const threadId = config.configurable?.thread_id;
    if (threadId === undefined || threadId === null) return undefined;
    const thread = String(threadId);
    const ns = namespaceOf(config);
    const checkpointId = getCheckpointId(config);
    let loaded: LoadStateResponse;
    try {
      loaded = await this.client.loadState(this.session(thread), {
        checkpointId: checkpointId ? stratadCheckpointId(thread, ns, checkpointId) : "",
        namespace: ns,
        includeWrites: true,
      });
    } catch (error) {
      if (error instanceof NotFoundError) return undefined;
      throw error;
    }
    return this.tuple(thread, loaded, true);
  }

  override async *list(config: RunnableConfig, options: CheckpointListOptions = {}): AsyncGenerator<CheckpointTuple> {
    const { filter, before } = options;
    let remaining = options.limit ?? -1;
    if (remaining === 0) return;
    const wantedId = config?.configurable?.checkpoint_id as string | undefined;
    const beforeId = before ? getCheckpointId(before) : "";
    for await (const [thread, sessionId] of this.threads(config)) {
      for await (const meta of this.metas(sessionId, thread, config, filter, before, remaining)) {
        const lgId = langgraphCheckpointId(meta.checkpointId);
        if (wantedId && lgId !== undefined && lgId !== wantedId) continue;
        // LangGraph's savers compare IDs (time-ordered uuid6) for `before`.
        if (beforeId && lgId !== undefined && lgId >= beforeId) continue;
        let loaded: LoadStateResponse;
        try {
          loaded = await this.client.loadState(sessionId, { checkpointId: meta.checkpointId, includeWrites: true });
        } catch (error) {
          if (error instanceof NotFoundError) continue; // deleted while listing
          throw error;
        }
        const tuple = await this.tuple(thread, loaded);
        if (wantedId && tuple.checkpoint.id !== wantedId) continue;
        if (beforeId && tuple.checkpoint.id >= beforeId) continue;
        yield tuple;
        remaining -= 1;
        if (remaining === 0) return;
      }
    }
  }

  /** (thread, session) pairs to list: one thread, or every LangGraph thread of the tenant. */
  private async *threads(config: RunnableConfig | undefined): AsyncGenerator<[string, string]> {
    const threadId = config?.configurable?.thread_id;
    if (threadId !== undefined && threadId !== null) {
      yield [String(threadId), this.session(String(threadId))];
      return;
    }
    for await (const session of this.client.listSessions({ prefix: this.sessionPrefix })) {
      const thread = session.labels[THREAD_LABEL];
      if (session.labels[INTEGRATION_LABEL] === INTEGRATION_VALUE && thread !== undefined) {
        yield [thread, session.sessionId];
      }
    }
  }

  /** The checkpoints of one session that the daemon can filter for, newest first. */
  private async *metas(
    sessionId: string,
    thread: string,
    config: RunnableConfig | undefined,
    filter: Record<string, unknown> | undefined,
    before: RunnableConfig | undefined,
    limit: number,
  ): AsyncGenerator<StratadCheckpoint> {
    const ns = config?.configurable?.checkpoint_ns as string | undefined;
    const beforeId = before ? getCheckpointId(before) : "";
    let beforeStratad = "";
    const beforeThread = before?.configurable?.thread_id;
    if (beforeId && (beforeThread === undefined || String(beforeThread) === thread)) {
      // The same thread: the daemon skips what was created after it.
      beforeStratad = stratadCheckpointId(thread, before?.configurable?.checkpoint_ns ?? ns ?? "", beforeId);
    }
    const metadataFilter = filter && Object.keys(filter).length > 0 ? (jsonSafe(filter) as JsonObject) : undefined;
    let pageToken = "";
    for (;;) {
      let page;
      try {
        page = await this.client.checkpoints.listCheckpoints({
          sessionId,
          pageSize: limit > 0 ? Math.min(limit, 1000) : PAGE,
          pageToken,
          namespace: ns,
          metadataFilter,
          before: beforeStratad,
        });
      } catch (error) {
        if (error instanceof NotFoundError) {
          if (beforeStratad && error.reason === Reason.CHECKPOINT_NOT_FOUND) {
            beforeStratad = ""; // `before` names a checkpoint that is gone: IDs are compared instead
            pageToken = "";
            continue;
          }
          return; // no such thread
        }
        throw error;
      }
      yield* page.checkpoints;
      if (!page.nextPageToken) return;
      pageToken = page.nextPageToken;
    }
  }

  /** A loaded stratad checkpoint as LangGraph's tuple. */
  private async tuple(thread: string, loaded: LoadStateResponse, seed = false): Promise<CheckpointTuple> {
    const meta = loaded.checkpoint;
    const contentType = meta?.contentType || loaded.contentType;
    const checkpointId = meta?.checkpointId || loaded.checkpointId;
    if (!contentType.startsWith(CONTENT_TYPE_PREFIX)) {
      throw new Error(
        `checkpoint ${JSON.stringify(checkpointId)} was not saved by a LangGraph saver (content type ${JSON.stringify(contentType)})`,
      );
    }
    const ns = meta?.namespace ?? "";
    const payload = isLayout(loaded.data)
      ? await decodeLayout(loaded.data, (type, data) => this.loads(type, data))
      : ((await this.loads(contentType.slice(CONTENT_TYPE_PREFIX.length), loaded.data)) as Payload);
    const checkpoint = payload.checkpoint;
    checkpoint.channel_values ??= {};
    checkpoint.channel_versions ??= {};
    checkpoint.versions_seen ??= {};
    if (seed) this.encoder.seed(scopeOf(thread, ns), checkpoint, loaded.data);
    const parent = payload.parent_checkpoint_id ?? undefined;
    this.storedChannels.set(checkpointId, new Set(Object.keys(checkpoint.channel_values)));
    if (checkpoint.v < 4 && parent) await this.migratePendingSends(checkpoint, thread, ns, parent);
    const pendingWrites: CheckpointPendingWrite[] = [];
    for (const write of meta?.pendingWrites ?? []) {
      pendingWrites.push([write.taskId, write.channel, await this.loads(write.type, write.value)]);
    }
    const tuple: CheckpointTuple = {
      config: { configurable: { thread_id: thread, checkpoint_ns: ns, checkpoint_id: checkpoint.id } },
      checkpoint,
      metadata: payload.metadata,
      pendingWrites,
    };
    if (parent) tuple.parentConfig = { configurable: { thread_id: thread, checkpoint_ns: ns, checkpoint_id: parent } };
    return tuple;
  }

  /** Deserializes a value; "msgpack", "null" and "bytearray" are what the Python saver writes too. */
  private async loads(type: string, data: Uint8Array): Promise<unknown> {
    if (type === "msgpack") return loadsPythonMsgpack(data);
    if (type === "null") return null;
    if (type === "bytearray") return data;
    return this.serde.loadsTyped(type, data);
  }

  /**
   * Checkpoints before format 4 kept the Sends of a step as pending writes to
   * TASKS of their parent; LangGraph now expects them in the channel (as every
   * saver of @langchain/langgraph-checkpoint migrates them when reading).
   */
  private async migratePendingSends(checkpoint: Checkpoint, thread: string, ns: string, parent: string): Promise<void> {
    let loaded: LoadStateResponse;
    try {
      loaded = await this.client.loadState(this.session(thread), {
        checkpointId: stratadCheckpointId(thread, ns, parent),
        includeWrites: true,
      });
    } catch (error) {
      if (error instanceof NotFoundError) return;
      throw error;
    }
    const sends: unknown[] = [];
    for (const write of loaded.checkpoint?.pendingWrites ?? []) {
      if (write.channel === TASKS) sends.push(await this.loads(write.type, write.value));
    }
    const versions = Object.values(checkpoint.channel_versions);
    checkpoint.channel_values[TASKS] = sends;
    checkpoint.channel_versions[TASKS] = versions.length > 0 ? maxChannelVersion(...versions) : this.getNextVersion(undefined);
  }

  // -- writing -------------------------------------------------------------

  override async put(
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    newVersions: ChannelVersions,
  ): Promise<RunnableConfig> {
    const thread = requiredThread(config, "put checkpoint");
    const ns = namespaceOf(config);
    const parent = getCheckpointId(config) || undefined;
    const key = stratadCheckpointId(thread, ns, checkpoint.id);
    const parentKey = parent ? stratadCheckpointId(thread, ns, parent) : "";
    const stored = copyCheckpoint(checkpoint);
    stored.channel_values = this.valuesToStore(checkpoint, newVersions, parentKey);
    this.storedChannels.set(key, new Set(Object.keys(stored.channel_values)));
    const sessionId = this.session(thread);
    const landing = this.landing(key);
    landing.started = true;
    const saving = this.saving.get(sessionId) ?? new Set<Landing>();
    this.saving.set(sessionId, saving.add(landing));
    try {
      const [type, data] =
        this.layout === "pieces"
          ? await this.encoder.encode(scopeOf(thread, ns), stored, metadata, parent ?? null)
          : await this.serde.dumpsTyped({ checkpoint: stored, metadata, parent_checkpoint_id: parent ?? null });
      await this.save(thread, {
        sessionId: this.session(thread),
        data,
        contentType: CONTENT_TYPE_PREFIX + type,
        metadata: jsonSafe(metadata) as JsonObject,
        checkpointId: key,
        parentCheckpointId: parentKey,
        namespace: ns,
        noParent: !parent,
      });
    } finally {
      landing.settle();
      saving.delete(landing);
      if (saving.size === 0 && this.saving.get(sessionId) === saving) this.saving.delete(sessionId);
    }
    return { configurable: { thread_id: thread, checkpoint_ns: ns, checkpoint_id: checkpoint.id } };
  }

  /**
   * The channel values a checkpoint stores: those of the channels that changed
   * (`newVersions`) and those its parent stored. LangGraph hands every value to
   * `put`; a value neither new nor stored before was never saved by a step (the
   * validation suite's "only store channel_values that have changed").
   * Unknown parent (saved by another process, not read here): all values.
   */
  private valuesToStore(checkpoint: Checkpoint, newVersions: ChannelVersions, parentKey: string): Record<string, unknown> {
    const values = checkpoint.channel_values ?? {};
    const inherited = parentKey ? this.storedChannels.get(parentKey) : new Set<string>();
    if (inherited === undefined) return { ...values };
    const kept: Record<string, unknown> = {};
    for (const [channel, value] of Object.entries(values)) {
      if (channel in newVersions || inherited.has(channel)) kept[channel] = value;
    }
    return kept;
  }

  /** SaveState, creating the thread's session on its first checkpoint. */
  private async save(thread: string, request: SaveRequest): Promise<void> {
    for (let attempt = 0; ; attempt += 1) {
      try {
        await this.client.checkpoints.saveState(request);
        return;
      } catch (error) {
        if (attempt >= 3) throw error;
        if (error instanceof NotFoundError && error.reason === Reason.SESSION_NOT_FOUND) {
          await this.createSession(request.sessionId, thread);
        } else if (error instanceof NotFoundError && request.parentCheckpointId && error.reason === Reason.CHECKPOINT_NOT_FOUND) {
          // The parent was deleted (its ID stays in the saved payload): a new line.
          request.parentCheckpointId = "";
          request.noParent = true;
        } else if (error instanceof AlreadyExistsError && (await this.sameCheckpoint(request))) {
          return; // a save the daemon took before a retry of it (the connection dropped)
        } else {
          throw error;
        }
      }
    }
  }

  private async createSession(sessionId: string, thread: string): Promise<void> {
    try {
      await this.client.createSession(sessionId, { labels: labelsOf(thread) });
    } catch (error) {
      if (!(error instanceof AlreadyExistsError)) throw error;
    }
  }

  /** Whether the stored checkpoint with this request's ID holds exactly its bytes. */
  private async sameCheckpoint(request: SaveRequest): Promise<boolean> {
    try {
      const stored = await this.client.loadState(request.sessionId, { checkpointId: request.checkpointId });
      return stored.contentType === request.contentType && equalBytes(stored.data, request.data);
    } catch (error) {
      if (error instanceof NotFoundError) return false;
      throw error;
    }
  }

  override async putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string, taskPath?: string): Promise<void> {
    const thread = requiredThread(config, "put writes");
    const checkpointId = config.configurable?.checkpoint_id as string | undefined;
    if (checkpointId === undefined || checkpointId === null || checkpointId === "") {
      throw new Error(
        'Failed to put writes. The passed RunnableConfig is missing a required "checkpoint_id" field in its "configurable" property.',
      );
    }
    if (writes.length === 0) return;
    const ns = namespaceOf(config);
    this.encoder.written(scopeOf(thread, ns), writes);
    const key = stratadCheckpointId(thread, ns, String(checkpointId));
    const items = [];
    for (const [index, [channel, value]] of writes.entries()) {
      const [type, data] = await this.serde.dumpsTyped(value);
      items.push({ idx: WRITES_IDX_MAP[channel] ?? index, channel, type, value: data });
    }
    const request = { sessionId: this.session(thread), checkpointId: key, taskId, taskPath: taskPath ?? "", writes: items };
    await this.checkpointSaved(request.sessionId, key);
    try {
      await this.client.checkpoints.putWrites(request);
    } catch (error) {
      // Not there (yet): a put this saver was not asked for yet, or another process's.
      if (!(error instanceof NotFoundError) || !(await this.landing(key).wait(this.deadlineMs))) throw error;
      await this.client.checkpoints.putWrites(request);
    }
  }

  /**
   * Waits until this saver's put of the checkpoint `key` is done, when it is
   * under way or likely to come. LangGraph chains its puts (each starts when
   * the previous one is done) but sends a step's writes at once, and a fast
   * graph runs several steps ahead of its puts: while puts into the same
   * session are under way, wait for one and look again (at most the deadline).
   * A checkpoint saved earlier, or by another process, is written to at once.
   */
  private async checkpointSaved(sessionId: string, key: string): Promise<void> {
    const deadline = Date.now() + (this.deadlineMs > 0 ? this.deadlineMs : 30_000);
    for (;;) {
      const landing = this.landed.get(key);
      if (landing?.started) {
        await landing.done;
        return;
      }
      const saving = this.saving.get(sessionId);
      if (!saving || saving.size === 0 || Date.now() > deadline) return;
      await Promise.race([...saving].map((other) => other.done));
      await new Promise((resolve) => setImmediate(resolve)); // LangGraph starts its next put
    }
  }

  private landing(key: string): Landing {
    let landing = this.landed.get(key);
    if (landing === undefined) {
      landing = new Landing();
      this.landed.set(key, landing);
    }
    return landing;
  }

  override async deleteThread(threadId: string): Promise<void> {
    try {
      await this.client.deleteSession(this.session(String(threadId)));
    } catch (error) {
      if (!(error instanceof NotFoundError)) throw error;
    }
  }

  // -- beyond BaseCheckpointSaver (as the Python saver) ----------------------

  /** Deletes the checkpoints of these runs (metadata `run_id`) in every thread of the tenant. */
  async deleteForRuns(runIds: string[]): Promise<void> {
    for (let start = 0; start < runIds.length; start += FILTERS_PER_CALL) {
      const filters = runIds.slice(start, start + FILTERS_PER_CALL).map((runId) => ({ run_id: String(runId) }));
      await this.client.checkpoints.deleteCheckpoints({ metadataFilters: filters });
    }
  }

  /** Copies every checkpoint of a thread into a new one (no state data is copied). */
  async copyThread(sourceThreadId: string, targetThreadId: string): Promise<void> {
    const source = String(sourceThreadId);
    const target = String(targetThreadId);
    const sessionId = this.session(source);
    const mapping: Record<string, string> = {};
    try {
      for await (const meta of this.client.listCheckpoints(sessionId, { pageSize: 1000 })) {
        let lgId = langgraphCheckpointId(meta.checkpointId);
        if (lgId === undefined) {
          const loaded = await this.client.loadState(sessionId, { checkpointId: meta.checkpointId });
          lgId = (await this.tuple(source, loaded)).checkpoint.id;
        }
        mapping[meta.checkpointId] = stratadCheckpointId(target, meta.namespace, lgId);
      }
      await this.client.checkpoints.copySession({
        sourceSessionId: sessionId,
        targetSessionId: this.session(target),
        labels: labelsOf(target),
        checkpointIds: mapping,
      });
    } catch (error) {
      if (error instanceof NotFoundError) return; // nothing to copy
      throw error;
    }
  }

  /** Keeps only the latest checkpoint of each namespace ("keep_latest"), or deletes them all ("delete"). */
  async prune(threadIds: string[], options: { strategy?: "keep_latest" | "delete" } = {}): Promise<void> {
    const strategy = options.strategy ?? "keep_latest";
    if (strategy !== "keep_latest" && strategy !== "delete") throw new Error(`unknown prune strategy ${JSON.stringify(strategy)}`);
    const sessions = threadIds.map((thread) => this.session(String(thread)));
    for (let start = 0; start < sessions.length; start += 1000) {
      await this.client.checkpoints.pruneCheckpoints({
        sessionIds: sessions.slice(start, start + 1000),
        strategy: strategy === "delete" ? PruneStrategy.DELETE : PruneStrategy.KEEP_LATEST,
      });
    }
  }

  /**
   * Integer versions, as LangGraph.js's own savers use. A thread whose versions
   * are strings (saved by the Python saver: "<32-digit counter>.<random>") goes
   * on in that format, so its versions keep their order.
   */
  override getNextVersion(current: number | undefined): number {
    if (typeof current === "string") {
      const counter = Number.parseInt((current as string).split(".")[0] ?? "0", 10);
      return `${String(counter + 1).padStart(32, "0")}.${Math.random().toFixed(14)}` as unknown as number;
    }
    return typeof current === "number" ? current + 1 : 1;
  }

  private session(thread: string): string {
    return sessionIdOf(thread, this.sessionPrefix);
  }
}

interface SaveRequest {
  sessionId: string;
  data: Uint8Array;
  contentType: string;
  metadata: JsonObject;
  checkpointId: string;
  parentCheckpointId: string;
  namespace: string;
  noParent: boolean;
}

/** A put of a checkpoint: started by this saver, and done (either way). */
class Landing {
  started = false;
  private resolve!: () => void;
  readonly done = new Promise<void>((resolve) => {
    this.resolve = resolve;
  });
  private settled = false;

  settle(): void {
    this.settled = true;
    this.resolve();
  }

  /** Whether the put finished within `ms`. */
  async wait(ms: number): Promise<boolean> {
    if (this.settled) return true;
    let timer: NodeJS.Timeout | undefined;
    const expired = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), ms > 0 ? ms : 30_000);
    });
    try {
      return await Promise.race([this.done.then(() => true), expired]);
    } finally {
      clearTimeout(timer);
    }
  }
}

/** A Map that forgets its oldest entries beyond `capacity`. */
class Bounded<V> {
  private readonly items = new Map<string, V>();
  constructor(private readonly capacity: number) {}

  get(key: string): V | undefined {
    return this.items.get(key);
  }

  set(key: string, value: V): void {
    this.items.delete(key);
    this.items.set(key, value);
    while (this.items.size > this.capacity) {
      const oldest = this.items.keys().next().value as string;
      this.items.delete(oldest);
    }
  }
}

function requiredThread(config: RunnableConfig, what: string): string {
  const threadId = config?.configurable?.thread_id;
  if (threadId === undefined || threadId === null || threadId === "") {
    throw new Error(
      `Failed to ${what}. The passed RunnableConfig is missing a required "thread_id" field in its "configurable" property.`,
    );
  }
  return String(threadId);
}

function scopeOf(thread: string, ns: string): string {
  return `${thread}\0${ns}`;
}

function namespaceOf(config: RunnableConfig): string {
  return String(config.configurable?.checkpoint_ns ?? "");
}

function labelsOf(thread: string): Record<string, string> {
  return { [INTEGRATION_LABEL]: INTEGRATION_VALUE, [THREAD_LABEL]: thread };
}

/** Metadata as JSON values, for the Struct the daemon filters on. */
function jsonSafe(value: unknown): JsonValue {
  const text = JSON.stringify(value ?? {}, (_key, item: unknown) => (typeof item === "bigint" ? item.toString() : item));
  return JSON.parse(text ?? "{}") as JsonValue;
}

function equalBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i += 1) if (a[i] !== b[i]) return false;
  return true;
}
