/**
 * How LangGraph's names map onto stratad's, exactly as the Python saver
 * (`stratad.integrations.langgraph`) maps them, so both read the same data:
 *
 * - a thread is a session: the thread ID itself when it is a valid stratad ID,
 *   otherwise `lg-<32 hex of BLAKE2b-128 of it>`;
 * - a checkpoint is the stratad checkpoint `<checkpoint id>.<16 hex of
 *   BLAKE2b-64 of "thread\0namespace">` (stratad checkpoint IDs are unique in
 *   a tenant, LangGraph's only within a thread and namespace); an ID that does
 *   not fit becomes `lgx-<32 hex of BLAKE2b-128 of "thread\0namespace\0id">`.
 */
import { blake2b } from "@noble/hashes/blake2.js";
import { bytesToHex } from "@noble/hashes/utils.js";

/** Content type of every state this saver (and the Python one) saves, + the serializer's type tag. */
export const CONTENT_TYPE_PREFIX = "application/vnd.langgraph.checkpoint+";
/** Session labels of the sessions the LangGraph savers create. */
export const INTEGRATION_LABEL = "stratad.integration";
export const INTEGRATION_VALUE = "langgraph";
export const THREAD_LABEL = "langgraph.thread_id";

const ID = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;
const REVERSIBLE = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,110}$/;
const SUFFIX = /^(.+)\.[0-9a-f]{16}$/;
const utf8 = new TextEncoder();

function blake2bHex(text: string, bytes: number): string {
  return bytesToHex(blake2b(utf8.encode(text), { dkLen: bytes }));
}

/** The stratad session of a LangGraph thread. */
export function sessionIdOf(threadId: string, prefix = ""): string {
  const candidate = `${prefix}${threadId}`;
  if (ID.test(candidate)) return candidate;
  return `${prefix}lg-${blake2bHex(threadId, 16)}`;
}

/** The stratad checkpoint ID of a LangGraph checkpoint (unique in the tenant). */
export function stratadCheckpointId(threadId: string, checkpointNs: string, checkpointId: string): string {
  const scope = blake2bHex(`${threadId}\0${checkpointNs}`, 8);
  if (REVERSIBLE.test(checkpointId)) return `${checkpointId}.${scope}`;
  return `lgx-${blake2bHex(`${threadId}\0${checkpointNs}\0${checkpointId}`, 16)}`;
}

/** The LangGraph checkpoint ID inside a stratad one (undefined: only its state has it). */
export function langgraphCheckpointId(stratadId: string): string | undefined {
  return SUFFIX.exec(stratadId)?.[1];
}
