/**
 * Reading what the Python saver wrote. Python's LangGraph serializes with
 * msgpack (serializer type "msgpack"), objects as msgpack extension types
 * that name a Python class; LangGraph.js has no msgpack serializer. This
 * turns such bytes into the JSON that LangGraph.js's JsonPlusSerializer
 * writes for the same values, which it then revives: LangChain messages become
 * @langchain/core messages, sets Sets, bytes Uint8Arrays, a DeltaSnapshot a
 * DeltaSnapshot; uuids and datetimes become strings, other objects (pydantic
 * models, dataclasses such as Interrupt) their fields, as Python's own
 * msgpack-to-JSON conversion does.
 */
import { ExtensionCodec, decode } from "@msgpack/msgpack";
import { JsonPlusSerializer } from "@langchain/langgraph-checkpoint";

// LangGraph's extension type codes (langgraph.checkpoint.serde.jsonplus).
const EXT_CONSTRUCTOR_SINGLE_ARG = 0;
const EXT_CONSTRUCTOR_POS_ARGS = 1;
const EXT_CONSTRUCTOR_KW_ARGS = 2;
const EXT_METHOD_SINGLE_ARG = 3;
const EXT_PYDANTIC_V1 = 4;
const EXT_PYDANTIC_V2 = 5;
const EXT_NUMPY_ARRAY = 6;
const EXT_DELTA_SNAPSHOT = 7;

const json = new JsonPlusSerializer();
const codec = new ExtensionCodec();
const options = { extensionCodec: codec };

for (const type of [
  EXT_CONSTRUCTOR_SINGLE_ARG,
  EXT_CONSTRUCTOR_POS_ARGS,
  EXT_CONSTRUCTOR_KW_ARGS,
  EXT_METHOD_SINGLE_ARG,
  EXT_PYDANTIC_V1,
  EXT_PYDANTIC_V2,
  EXT_NUMPY_ARRAY,
  EXT_DELTA_SNAPSHOT,
]) {
  codec.register({
    type,
    encode: () => null, // decoding only
    decode: (data: Uint8Array) => fromExtension(type, decode(data, options)),
  });
}

/** A Python object (an extension type) as the JSON LangGraph.js would have written. */
function fromExtension(type: number, value: unknown): unknown {
  if (type === EXT_DELTA_SNAPSHOT) return { lc: 2, type: "delta_snapshot", value: jsonReady(value) };
  if (!Array.isArray(value)) return null;
  const [module, name, arg] = value as [string, string, unknown];
  switch (type) {
    case EXT_CONSTRUCTOR_SINGLE_ARG:
      if (module === "uuid" && name === "UUID" && typeof arg === "string" && arg.length === 32) {
        return `${arg.slice(0, 8)}-${arg.slice(8, 12)}-${arg.slice(12, 16)}-${arg.slice(16, 20)}-${arg.slice(20)}`;
      }
      if (module === "builtins" && (name === "set" || name === "frozenset") && Array.isArray(arg)) {
        return { lc: 2, type: "constructor", id: ["Set"], method: null, args: [jsonReady(arg)], kwargs: {} };
      }
      return arg;
    case EXT_CONSTRUCTOR_POS_ARGS:
      if (module === "langgraph.types" && name === "Send" && Array.isArray(arg)) return { node: arg[0], args: arg[1] };
      return arg;
    case EXT_PYDANTIC_V1:
    case EXT_PYDANTIC_V2:
      if (module.startsWith("langchain_core.messages") && isRecord(arg)) return message(name, arg);
      return arg;
    case EXT_CONSTRUCTOR_KW_ARGS:
    case EXT_METHOD_SINGLE_ARG:
      return arg;
    default: // numpy arrays have no LangGraph.js counterpart
      return null;
  }
}

/** A LangChain message in the serialized form @langchain/core's `load` revives. */
function message(name: string, fields: Record<string, unknown>): unknown {
  const kwargs: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(fields)) {
    if (key !== "type" && value !== null && value !== undefined) kwargs[key] = value;
  }
  return { lc: 1, type: "constructor", id: ["langchain_core", "messages", name], kwargs };
}

/** Values JSON cannot hold as themselves, as JsonPlusSerializer records them. */
function jsonReady(value: unknown): unknown {
  if (value instanceof Uint8Array) {
    return { lc: 2, type: "constructor", id: ["Uint8Array"], method: "from", args: [Array.from(value)], kwargs: {} };
  }
  if (Array.isArray(value)) return value.map(jsonReady);
  if (value instanceof Map) return Object.fromEntries([...value].map(([k, v]) => [String(k), jsonReady(v)]));
  if (isRecord(value)) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, jsonReady(v)]));
  return value;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value) && !(value instanceof Uint8Array);
}

/** Values saved by Python's JsonPlusSerializer as msgpack, revived for LangGraph.js. */
export async function loadsPythonMsgpack(data: Uint8Array): Promise<unknown> {
  const tree = decode(data, { ...options, mapKeyConverter: (key: unknown) => String(key) });
  return json.loadsTyped("json", JSON.stringify(jsonReady(tree)));
}
