/**
 * The stored layout of a checkpoint, shared with the Python saver
 * (`encode_layout` / `decode_layout` in stratad.integrations.langgraph):
 *
 *     state = MAGIC | piece* | trailer piece | u32 LE length of the trailer piece
 *     piece = u8 length of the serde type | u32 LE length of the data | type | data
 *
 * The pieces are, in order: every element of each list channel (a message
 * history; channels sorted by name), then one piece per other channel (sorted
 * by name). The trailer is the serializer's dump of {"checkpoint": the
 * checkpoint without channel_values, "metadata", "parent_checkpoint_id",
 * "channels": [[name, element count, or -1 for a value], ...]}. A list that
 * grows by appending grows the state just before the trailer: the bytes
 * before stay the same, so the daemon's content-defined chunks that hold them
 * are the previous checkpoint's, and a step stores what it added.
 *
 * Earlier checkpoints (and `layout: "payload"`) are one dump of
 * {checkpoint, metadata, parent_checkpoint_id}; both read both.
 */
import type { Checkpoint, CheckpointMetadata, PendingWrite } from "@langchain/langgraph-checkpoint";

export const LAYOUT_MAGIC = new TextEncoder().encode("SLG2\n");
const HEAD = 5; // u8 + u32

type Dumps = (value: unknown) => Promise<[string, Uint8Array]>;
type Loads = (type: string, data: Uint8Array) => Promise<unknown>;

/** A checkpoint as stored: the same object in either layout. */
export interface Payload {
  checkpoint: Checkpoint;
  metadata: CheckpointMetadata;
  parent_checkpoint_id: string | null;
}

export function isLayout(data: Uint8Array): boolean {
  if (data.length < LAYOUT_MAGIC.length) return false;
  return LAYOUT_MAGIC.every((byte, i) => data[i] === byte);
}

const utf8 = new TextEncoder();
const fromUtf8 = new TextDecoder();

export function encodePiece(type: string, data: Uint8Array): Uint8Array {
  const tag = utf8.encode(type);
  const piece = new Uint8Array(HEAD + tag.length + data.length);
  const view = new DataView(piece.buffer);
  view.setUint8(0, tag.length);
  view.setUint32(1, data.length, true);
  piece.set(tag, HEAD);
  piece.set(data, HEAD + tag.length);
  return piece;
}

/** [start, end) of each piece in data[start, end). */
function readPieces(data: Uint8Array, start: number, end: number): [number, number][] {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const out: [number, number][] = [];
  for (let offset = start; offset < end; ) {
    if (offset + HEAD > end) throw new Error("truncated StratadSaver checkpoint (piece header)");
    const stop = offset + HEAD + view.getUint8(offset) + view.getUint32(offset + 1, true);
    if (stop > end) throw new Error("truncated StratadSaver checkpoint (piece)");
    out.push([offset, stop]);
    offset = stop;
  }
  return out;
}

function typed(data: Uint8Array, [start, stop]: [number, number]): [string, Uint8Array] {
  const tagEnd = start + HEAD + data[start]!;
  return [fromUtf8.decode(data.subarray(start + HEAD, tagEnd)), data.subarray(tagEnd, stop)];
}

export async function decodeLayout(data: Uint8Array, loads: Loads): Promise<Payload> {
  if (!isLayout(data) || data.length < LAYOUT_MAGIC.length + 4) {
    throw new Error("not a StratadSaver checkpoint layout (bad magic)");
  }
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const trailerStart = data.length - 4 - view.getUint32(data.length - 4, true);
  if (trailerStart < LAYOUT_MAGIC.length) throw new Error("truncated StratadSaver checkpoint (trailer)");
  const [trailer] = readPieces(data, trailerStart, data.length - 4);
  const header = (await loads(...typed(data, trailer!))) as Record<string, unknown>;
  const pieces = readPieces(data, LAYOUT_MAGIC.length, trailerStart);
  const values: Record<string, unknown> = {};
  let at = 0;
  for (const [name, count] of header.channels as [string, number][]) {
    if (count < 0) {
      values[name] = await loads(...typed(data, pieces[at]!));
      at += 1;
      continue;
    }
    if (at + count > pieces.length) throw new Error("truncated StratadSaver checkpoint (list)");
    const items = [];
    for (const piece of pieces.slice(at, at + count)) items.push(await loads(...typed(data, piece)));
    values[name] = items;
    at += count;
  }
  if (at !== pieces.length) throw new Error("StratadSaver checkpoint has pieces its trailer does not name");
  const checkpoint = header.checkpoint as Checkpoint;
  checkpoint.channel_values = values;
  return {
    checkpoint,
    metadata: header.metadata as CheckpointMetadata,
    parent_checkpoint_id: (header.parent_checkpoint_id as string | null | undefined) ?? null,
  };
}

/** Python's `sorted()` of names: by code point. */
function byCodePoint(a: string, b: string): number {
  const x = [...a];
  const y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i += 1) {
    const d = x[i]!.codePointAt(0)! - y[i]!.codePointAt(0)!;
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

interface ListMemo {
  objects: unknown[];
  pieces: Uint8Array[];
  bytes: number;
}

interface ValueMemo {
  version: unknown;
  piece: Uint8Array;
  bytes: number;
}

/**
 * Encodes checkpoints in the layout, reusing the pieces of the previous put of
 * the same (thread, namespace, channel) as the Python saver does: a value whose
 * channel version is the same (LangGraph changes a channel's version whenever
 * its value changes), and the leading elements of a list that are the same
 * objects as before (LangGraph's reducers build a new list and keep the
 * elements they do not replace). Objects a task wrote (putWrites) since are
 * serialized again. Least recently used first out, at most `maxBytes` of
 * pieces; 0 keeps nothing.
 */
export class LayoutEncoder {
  private readonly lists = new Map<string, ListMemo>();
  private readonly values = new Map<string, ValueMemo>();
  private readonly dirty = new Map<string, WeakSet<object>>();
  private bytes = 0;

  constructor(
    private readonly dumps: Dumps,
    private readonly maxBytes: number,
  ) {}

  /** Objects a task wrote: serialized again at the next put of their scope. */
  written(scope: string, writes: PendingWrite[]): void {
    if (!this.maxBytes) return;
    const seen = this.dirty.get(scope) ?? new WeakSet<object>();
    const mark = (value: unknown) => {
      if (typeof value === "object" && value !== null) seen.add(value);
    };
    for (const [, value] of writes) {
      mark(value);
      if (Array.isArray(value)) value.forEach(mark);
    }
    this.dirty.set(scope, seen);
  }

  /** [serde type of the trailer, the state]. */
  async encode(scope: string, checkpoint: Checkpoint, metadata: unknown, parent: string | null): Promise<[string, Uint8Array]> {
    const values = checkpoint.channel_values as Record<string, unknown>;
    const versions = (checkpoint.channel_versions ?? {}) as Record<string, unknown>;
    const names = Object.keys(values).sort(byCodePoint);
    const lists = names.filter((name) => Array.isArray(values[name]));
    const others = names.filter((name) => !Array.isArray(values[name]));
    const dirty = this.dirty.get(scope);
    this.dirty.delete(scope);
    const parts: Uint8Array[] = [LAYOUT_MAGIC];
    const channels: [string, number][] = [];
    for (const name of lists) {
      const pieces = await this.list(`${scope}\0${name}`, values[name] as unknown[], dirty);
      parts.push(...pieces);
      channels.push([name, pieces.length]);
    }
    for (const name of others) {
      parts.push(await this.value(`${scope}\0${name}`, values[name], versions[name]));
      channels.push([name, -1]);
    }
    const { channel_values: _values, ...rest } = checkpoint;
    const [type, header] = await this.dumps({ checkpoint: rest, metadata, parent_checkpoint_id: parent, channels });
    const trailer = encodePiece(type, header);
    parts.push(trailer);
    const length = new Uint8Array(4);
    new DataView(length.buffer).setUint32(0, trailer.length, true);
    parts.push(length);
    return [type, concat(parts)];
  }

  private async list(key: string, value: unknown[], dirty: WeakSet<object> | undefined): Promise<Uint8Array[]> {
    const memo = this.maxBytes ? this.lists.get(key) : undefined;
    let keep = 0;
    if (memo !== undefined) {
      const limit = Math.min(value.length, memo.objects.length);
      while (keep < limit && value[keep] === memo.objects[keep] && !isDirty(value[keep], dirty)) keep += 1;
    }
    const pieces = memo ? memo.pieces.slice(0, keep) : [];
    for (const item of value.slice(keep)) pieces.push(encodePiece(...(await this.dumps(item))));
    if (this.maxBytes) {
      this.remember(this.lists, key, { objects: [...value], pieces, bytes: pieces.reduce((n, p) => n + p.length, 0) });
    }
    return pieces;
  }

  private async value(key: string, value: unknown, version: unknown): Promise<Uint8Array> {
    const known = this.maxBytes ? this.values.get(key) : undefined;
    if (known !== undefined && version !== undefined && known.version === version) return known.piece;
    const piece = encodePiece(...(await this.dumps(value)));
    if (this.maxBytes) this.remember(this.values, key, { version, piece, bytes: piece.length });
    return piece;
  }

  private remember<T extends { bytes: number }>(table: Map<string, T>, key: string, entry: T): void {
    const old = table.get(key);
    if (old !== undefined) {
      table.delete(key);
      this.bytes -= old.bytes;
    }
    if (entry.bytes > this.maxBytes) return;
    table.set(key, entry);
    this.bytes += entry.bytes;
    while (this.bytes > this.maxBytes) {
      const from: Map<string, { bytes: number }> = this.lists.size > 0 ? this.lists : this.values;
      const [oldest, gone] = from.entries().next().value as [string, { bytes: number }];
      from.delete(oldest);
      this.bytes -= gone.bytes;
    }
  }

  /** Remembers the pieces of a loaded checkpoint: a resumed thread's next put serializes what it adds. */
  seed(scope: string, checkpoint: Checkpoint, data: Uint8Array): void {
    if (!this.maxBytes || !isLayout(data)) return;
    try {
      const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
      const trailerStart = data.length - 4 - view.getUint32(data.length - 4, true);
      const pieces = readPieces(data, LAYOUT_MAGIC.length, trailerStart);
      const values = checkpoint.channel_values as Record<string, unknown>;
      const versions = (checkpoint.channel_versions ?? {}) as Record<string, unknown>;
      const names = Object.keys(values).sort(byCodePoint);
      let at = 0;
      for (const name of names.filter((n) => Array.isArray(values[n]))) {
        const objects = values[name] as unknown[];
        const own = pieces.slice(at, at + objects.length).map(([s, e]) => data.slice(s, e));
        this.remember(this.lists, `${scope}\0${name}`, { objects: [...objects], pieces: own, bytes: own.reduce((n, p) => n + p.length, 0) });
        at += objects.length;
      }
      for (const name of names.filter((n) => !Array.isArray(values[n]))) {
        const [s, e] = pieces[at]!;
        this.remember(this.values, `${scope}\0${name}`, { version: versions[name], piece: data.slice(s, e), bytes: e - s });
        at += 1;
      }
    } catch {
      // Only a cache: a checkpoint it cannot read is serialized again.
    }
  }
}

function isDirty(value: unknown, dirty: WeakSet<object> | undefined): boolean {
  return dirty !== undefined && typeof value === "object" && value !== null && dirty.has(value);
}

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let offset = 0;
  for (const part of parts) {
    out.set(part, offset);
    offset += part.length;
  }
  return out;
}
