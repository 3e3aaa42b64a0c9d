/**
 * Typed errors. Every failure of a stratad call is a `StratadError` whose
 * class follows the gRPC status code (the same classes as the Python SDK's
 * `stratad.errors`), with the daemon's machine-readable `reason` and string
 * `metadata` from the `google.rpc.ErrorInfo` (domain `stratad.dev`) it sends
 * in the `grpc-status-details-bin` trailer. Branch on `reason`, never on the
 * English message.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** The google.rpc.ErrorInfo domain of every reason stratad reports. */
export const ERROR_DOMAIN = "stratad.dev";

/**
 * The reasons the daemon reports (docs/errors.md). `StratadError.reason` is a
 * plain string: a newer daemon may send a reason this list does not know yet.
 */
export const Reason = {
  INVALID_ARGUMENT: "INVALID_ARGUMENT",
  INVALID_ID: "INVALID_ID",
  INVALID_VALUE: "INVALID_VALUE",
  MALFORMED_REQUEST: "MALFORMED_REQUEST",
  MESSAGE_TOO_LARGE: "MESSAGE_TOO_LARGE",
  UPLOAD_MISMATCH: "UPLOAD_MISMATCH",
  NOT_FOUND: "NOT_FOUND",
  SESSION_NOT_FOUND: "SESSION_NOT_FOUND",
  CHECKPOINT_NOT_FOUND: "CHECKPOINT_NOT_FOUND",
  ALREADY_EXISTS: "ALREADY_EXISTS",
  FAILED_PRECONDITION: "FAILED_PRECONDITION",
  SESSION_NOT_PAUSED: "SESSION_NOT_PAUSED",
  NOT_INITIALIZED: "NOT_INITIALIZED",
  CHUNKS_MISSING: "CHUNKS_MISSING",
  LEASE_HELD: "LEASE_HELD",
  LEASE_LOST: "LEASE_LOST",
  REPLICATION_OFF: "REPLICATION_OFF",
  ENCRYPTION_KEY: "ENCRYPTION_KEY",
  VERSION_CONFLICT: "VERSION_CONFLICT",
  RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
  QUOTA_EXCEEDED: "QUOTA_EXCEEDED",
  DISK_FULL: "DISK_FULL",
  READ_ONLY: "READ_ONLY",
  OVERLOADED: "OVERLOADED",
  WATCHER_TOO_SLOW: "WATCHER_TOO_SLOW",
  DECOMPRESSION_LIMIT: "DECOMPRESSION_LIMIT",
  GC_IN_PROGRESS: "GC_IN_PROGRESS",
  UNAUTHENTICATED: "UNAUTHENTICATED",
  MISSING_CREDENTIALS: "MISSING_CREDENTIALS",
  INVALID_TOKEN: "INVALID_TOKEN",
  UNKNOWN_CLIENT_CERTIFICATE: "UNKNOWN_CLIENT_CERTIFICATE",
  PERMISSION_DENIED: "PERMISSION_DENIED",
  TENANT_MISMATCH: "TENANT_MISMATCH",
  ADMIN_ROLE_REQUIRED: "ADMIN_ROLE_REQUIRED",
  UNAVAILABLE: "UNAVAILABLE",
  SHUTTING_DOWN: "SHUTTING_DOWN",
  STORAGE_FAILED: "STORAGE_FAILED",
  JOURNAL_FAILED: "JOURNAL_FAILED",
  REMOTE_UNAVAILABLE: "REMOTE_UNAVAILABLE",
  // Found by the client itself, with UNAVAILABLE, when its TLS settings and
  // the daemon's differ; the message names the fix (docs/security.md).
  TLS_REQUIRED: "TLS_REQUIRED",
  CLIENT_CERT_REQUIRED: "CLIENT_CERT_REQUIRED",
  TLS_NOT_SUPPORTED: "TLS_NOT_SUPPORTED",
  DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
  DATA_LOSS: "DATA_LOSS",
  CORRUPT_OBJECT: "CORRUPT_OBJECT",
  INTERNAL: "INTERNAL",
} as const;
export type Reason = (typeof Reason)[keyof typeof Reason];

export interface StratadErrorInit {
  code: Code;
  reason?: string;
  metadata?: Record<string, string>;
  cause?: unknown;
}

/** A failed stratad call: gRPC `code`, stable `reason`, and the reason's `metadata`. */
export class StratadError extends Error {
  /** The gRPC status code (connect's `Code`: the same numbers as gRPC's). */
  readonly code: Code;
  /** A stable UPPER_SNAKE_CASE word such as `VERSION_CONFLICT` (see `Reason`). */
  readonly reason: string;
  /** Details of the reason, e.g. `{expected: "3", actual: "4"}` for a version conflict. */
  readonly metadata: Readonly<Record<string, string>>;

  constructor(message: string, init: StratadErrorInit) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.code = init.code;
    this.reason = init.reason || defaultReason(init.code);
    this.metadata = Object.freeze({ ...init.metadata });
  }

  /** The code's name, e.g. `NOT_FOUND`. */
  get codeName(): string {
    return codeName(this.code);
  }
}

/** Malformed input: a bad ID, a missing field, a value out of range. */
export class InvalidArgumentError extends StratadError {}
/** The resource does not exist (or belongs to another tenant). */
export class NotFoundError extends StratadError {}
/** A resource with that ID exists already. */
export class AlreadyExistsError extends StratadError {}
/** The resource is not in the state the operation requires. */
export class FailedPreconditionError extends StratadError {}
/** `expectedVersion` did not match the session's version (ABORTED): reload, then retry. */
export class VersionConflictError extends StratadError {}
/** A size limit, a quota, the disk, or the daemon's in-flight budget is full. */
export class ResourceExhaustedError extends StratadError {}
/** Stored bytes failed their checksum: stratad never returns wrong data. */
export class DataLossError extends StratadError {}
export class UnauthenticatedError extends StratadError {}
export class PermissionDeniedError extends StratadError {}
/** The daemon is shutting down or cannot be reached (retried before it is thrown). */
export class UnavailableError extends StratadError {}
/** The call's deadline passed before the daemon answered. */
export class DeadlineExceededError extends StratadError {}
/** The call was cancelled by the caller (an AbortSignal). */
export class CanceledError extends StratadError {}
/** A bug in the daemon; the message carries an incident ID its log repeats. */
export class InternalError extends StratadError {}

const ERROR_BY_CODE: Partial<Record<Code, typeof StratadError>> = {
  [Code.InvalidArgument]: InvalidArgumentError,
  [Code.NotFound]: NotFoundError,
  [Code.AlreadyExists]: AlreadyExistsError,
  [Code.FailedPrecondition]: FailedPreconditionError,
  [Code.Aborted]: VersionConflictError,
  [Code.ResourceExhausted]: ResourceExhaustedError,
  [Code.DataLoss]: DataLossError,
  [Code.Unauthenticated]: UnauthenticatedError,
  [Code.PermissionDenied]: PermissionDeniedError,
  [Code.Unavailable]: UnavailableError,
  [Code.DeadlineExceeded]: DeadlineExceededError,
  [Code.Canceled]: CanceledError,
  [Code.Internal]: InternalError,
};

/** `Code.NotFound` -> `NOT_FOUND`, as gRPC spells status codes. */
export function codeName(code: Code): string {
  if (code === Code.Canceled) return "CANCELLED"; // gRPC's spelling
  return (Code[code] ?? "UNKNOWN").replace(/(?<=[a-z])(?=[A-Z])/g, "_").toUpperCase();
}

/** The reason an error without an ErrorInfo gets: what the Python SDK uses too. */
function defaultReason(code: Code): string {
  return code === Code.Aborted ? Reason.VERSION_CONFLICT : codeName(code);
}

/**
 * The StratadError for anything a call threw: a ConnectError (its ErrorInfo
 * decoded from the status details), an AbortError, or any other value.
 */
export function toStratadError(error: unknown): StratadError {
  if (error instanceof StratadError) return error;
  const connectError = asTransportFailure(ConnectError.from(error));
  const info = connectError
    .findDetails(ErrorInfoSchema)
    .find((detail) => detail.domain === ERROR_DOMAIN);
  const ErrorClass = ERROR_BY_CODE[connectError.code] ?? StratadError;
  return new ErrorClass(connectError.rawMessage, {
    code: connectError.code,
    reason: info?.reason,
    metadata: info?.metadata,
    cause: connectError,
  });
}

/**
 * gRPC reports a call that failed below it (connection reset, TLS handshake,
 * protocol error) as UNAVAILABLE; connect-node reports such Node.js errors as
 * INTERNAL or ABORTED, which would read as a daemon bug or as a version
 * conflict. A status the daemon sent has no Node.js error as its cause.
 */
export function asTransportFailure(error: ConnectError): ConnectError {
  const transportCodes = [Code.Internal, Code.Aborted, Code.Unknown];
  if (!transportCodes.includes(error.code) || nodeErrorCode(error.cause) === undefined) return error;
  return new ConnectError(error.rawMessage, Code.Unavailable, error.metadata, undefined, error.cause);
}

/** The `code` of the first Node.js error (ECONNRESET, ERR_TLS_...) in a cause chain. */
function nodeErrorCode(cause: unknown, depth = 0): string | undefined {
  if (!(cause instanceof Error) || depth > 8) return undefined;
  const code = (cause as { code?: unknown }).code;
  return typeof code === "string" ? code : nodeErrorCode(cause.cause, depth + 1);
}

/**
 * The same client with every failure rethrown as a StratadError: a method's
 * rejected promise, or the error that ends a response stream. For clients
 * made with connect's `createClient` (StratadClient's raw clients are made so).
 */
export function withStratadErrors<T extends object>(client: T): T {
  const wrapped: Record<string, unknown> = {};
  for (const [name, member] of Object.entries(client)) {
    wrapped[name] =
      typeof member === "function"
        ? (...args: unknown[]) => translateFailures(member.apply(client, args))
        : member;
  }
  return wrapped as T;
}

function translateFailures(result: unknown): unknown {
  if (result instanceof Promise) {
    return result.catch((error: unknown) => {
      throw toStratadError(error);
    });
  }
  if (isAsyncIterable(result)) return translateStream(result);
  return result;
}

async function* translateStream<T>(messages: AsyncIterable<T>): AsyncGenerator<T> {
  try {
    yield* messages;
  } catch (error) {
    throw toStratadError(error);
  }
}

function isAsyncIterable(value: unknown): value is AsyncIterable<unknown> {
  return typeof value === "object" && value !== null && Symbol.asyncIterator in value;
}
