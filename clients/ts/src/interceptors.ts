/**
 * The interceptors every call of a StratadClient goes through, raw generated
 * clients included: the TLS-mismatch diagnosis outermost (src/diagnose.ts),
 * then retries, then the tenant and bearer token headers. (Errors are translated outside the transport, by
 * `withStratadErrors`: connect rewraps whatever an interceptor throws.)
 */
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { asTransportFailure } from "./errors.js";

/** Adds fixed headers (tenant, authorization) to every request. */
export function headersInterceptor(headers: Record<string, string>): Interceptor {
  return (next) => (request) => {
    for (const [name, value] of Object.entries(headers)) request.header.set(name, value);
    return next(request);
  };
}

export interface RetryPolicy {
  /** Attempts in all, the first included (1 = no retry). */
  maxAttempts: number;
  /** Backoff before the second attempt; doubles each time up to maxBackoffMs. */
  initialBackoffMs: number;
  maxBackoffMs: number;
}

/** The Python SDK's policy: 5 attempts, 50 ms doubling up to 2 s. */
export const DEFAULT_RETRY_POLICY: RetryPolicy = {
  maxAttempts: 5,
  initialBackoffMs: 50,
  maxBackoffMs: 2000,
};

/**
 * Retries unary calls that fail with UNAVAILABLE (daemon unreachable,
 * restarting, or shutting down: it refused the call without acting on it),
 * with exponential backoff and full jitter, within the call's deadline.
 * Streaming calls are never retried: their messages may have been consumed.
 */
export function retryInterceptor(policy: RetryPolicy): Interceptor {
  return (next) => async (request) => {
    if (request.stream) return next(request);
    for (let attempt = 1; ; attempt++) {
      try {
        return await next(request);
      } catch (thrown) {
        const error = asUnavailable(asTransportFailure(ConnectError.from(thrown)), request.signal);
        const retryable = error.code === Code.Unavailable;
        if (!retryable || attempt >= policy.maxAttempts || request.signal.aborted) throw error;
        await sleep(backoffMs(policy, attempt), request.signal);
      }
    }
  };
}

/**
 * connect reports a connection the peer dropped as CANCELED ("http/2 stream
 * closed with error code CANCEL"); gRPC calls that UNAVAILABLE. Only the
 * caller's signal (or the deadline) cancels a call, so a CANCELED without an
 * aborted signal is the transport failing.
 */
export function asUnavailable(error: ConnectError, signal: AbortSignal): ConnectError {
  if (error.code !== Code.Canceled || signal.aborted) return error;
  return new ConnectError(error.rawMessage, Code.Unavailable, error.metadata, undefined, error);
}

function backoffMs(policy: RetryPolicy, attempt: number): number {
  const ceiling = Math.min(policy.maxBackoffMs, policy.initialBackoffMs * 2 ** (attempt - 1));
  return Math.random() * ceiling;
}

/** Waits, or rejects with the signal's reason (the deadline, a cancel) when it fires first. */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(timer);
      reject(ConnectError.from(signal.reason, Code.Canceled));
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}
