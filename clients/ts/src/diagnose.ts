/**
 * Why a connection failed, when the client's and the daemon's TLS settings
 * differ. A plaintext client on a TLS listener ("read ECONNRESET"), a TLS
 * client without a certificate on an mTLS listener ("tlsv13 alert certificate
 * required") and a TLS client on a plaintext listener ("wrong version number")
 * all fail as UNAVAILABLE with what the transport saw, which does not say what
 * to change. So when a call fails UNAVAILABLE without having reached the
 * daemon (no stratad ErrorInfo), after the client's retries, the client probes
 * the address once, within PROBE_TIMEOUT_MS: a TLS handshake with certificate
 * verification off (only to learn whether the port speaks TLS), then one read
 * (a daemon that requires a client certificate refuses one without it there,
 * with a `certificate_required` alert); and if the port does not speak TLS,
 * the HTTP/2 client preface in plaintext (a plaintext daemon answers with its
 * SETTINGS frame). When that explains the failure, the error keeps its
 * UNAVAILABLE code, names the fix in its message and carries the reason
 * `TLS_REQUIRED`, `CLIENT_CERT_REQUIRED` or `TLS_NOT_SUPPORTED` (as an
 * ErrorInfo, so `StratadError.reason` has it). Unix sockets and successful
 * calls are never probed, and nothing is remembered: the next failure probes
 * again (the daemon may have restarted with other settings).
 */
import { connect as netConnect, isIP, type Socket } from "node:net";
import { connect as tlsConnect } from "node:tls";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { parseAddress, type Connection } from "./connection.js";
import { asTransportFailure, ERROR_DOMAIN, Reason } from "./errors.js";
import { asUnavailable } from "./interceptors.js";
import { ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** The most a probe adds to a failed call, both connections included. */
export const PROBE_TIMEOUT_MS = 2000;

/** What the probe learned about the port. */
export type Finding =
  | "tls" // speaks TLS; serves a client without a certificate
  | "tls-client-certificate" // speaks TLS, refuses a client without a certificate
  | "plaintext-http2" // answered the HTTP/2 preface in plaintext
  | "unknown"; // unreachable, silent, or something else

const H2_PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
const H2_EMPTY_SETTINGS = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]);
/** Alerts a server sends a client that did not present the certificate it asked for. */
const CERTIFICATE_ALERTS = ["CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE", "BAD_CERTIFICATE"];

/**
 * Whether the port speaks TLS (and refuses a client without a certificate),
 * or (`plaintext`: asked only when the port is not TLS) plaintext HTTP/2.
 */
export async function probe(
  host: string,
  port: number,
  options: { serverName?: string; timeoutMs?: number; plaintext?: boolean } = {},
): Promise<Finding> {
  const deadline = Date.now() + (options.timeoutMs ?? PROBE_TIMEOUT_MS);
  const finding = await probeTls(host, port, options.serverName ?? "", deadline);
  if (finding !== "not-tls") return finding;
  if (options.plaintext === false) return "unknown";
  return (await speaksPlaintextH2(host, port, deadline)) ? "plaintext-http2" : "unknown";
}

function errorCode(error: unknown): string {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" ? code : "";
}

function isCertificateAlert(code: string): boolean {
  return code.includes("ALERT") && CERTIFICATE_ALERTS.some((alert) => code.includes(alert));
}

/**
 * Settles with the first outcome `run` reports, or `atDeadline()` at the
 * deadline; the socket is destroyed then.
 */
function settle<T>(
  socket: Socket,
  deadline: number,
  atDeadline: () => T,
  run: (done: (value: T) => void) => void,
): Promise<T> {
  return new Promise((resolve) => {
    let settled = false;
    const done = (value: T) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      resolve(value);
    };
    const timer = setTimeout(() => done(atDeadline()), Math.max(0, deadline - Date.now()));
    run(done);
  });
}

/** A TLS handshake with verification off, then one read; "not-tls" when the answer was no TLS. */
function probeTls(host: string, port: number, serverName: string, deadline: number): Promise<Finding | "not-tls"> {
  const servername = serverName || (isIP(host) ? undefined : host);
  const socket = tlsConnect({
    host,
    port,
    servername,
    // What the port speaks, not whom it proves to be: nothing is sent over it.
    rejectUnauthorized: false,
    ALPNProtocols: ["h2"],
  });
  let secured = false;
  return settle<Finding | "not-tls">(socket, deadline, () => (secured ? "tls" : "unknown"), (done) => {
    socket.once("secureConnect", () => {
      secured = true;
      // TLS 1.3: the server checks the (empty) certificate once the client has
      // finished; a refusal is the first thing it sends, else its SETTINGS.
      socket.once("data", () => done("tls"));
      socket.once("end", () => done("tls"));
    });
    socket.on("error", (error) => {
      const code = errorCode(error);
      if (isCertificateAlert(code)) done("tls-client-certificate");
      else if (secured || code.includes("ALERT")) done("tls");
      else if (code.startsWith("ERR_SSL_")) done("not-tls"); // wrong version number & co
      else done("unknown");
    });
  });
}

/** Whether the port answers the HTTP/2 client preface with a SETTINGS frame. */
function speaksPlaintextH2(host: string, port: number, deadline: number): Promise<boolean> {
  if (Date.now() >= deadline) return Promise.resolve(false);
  const socket = netConnect({ host, port });
  return settle(socket, deadline, () => false, (done) => {
    let head = Buffer.alloc(0);
    socket.once("connect", () => socket.write(Buffer.concat([H2_PREFACE, H2_EMPTY_SETTINGS])));
    socket.on("data", (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      if (head.length < 9) return;
      // A frame header: length (3), type 4 (SETTINGS), flags, stream 0.
      done(head[3] === 4 && head.readUInt32BE(5) === 0);
    });
    socket.on("end", () => done(false));
    socket.on("error", () => done(false));
  });
}

/** A TLS mismatch: its reason and the message that names the fix. */
export interface Diagnosis {
  reason: string;
  message: string;
}

/**
 * Probes the connection's address and says which TLS setting to change, if
 * one explains a failed connection; undefined for unix sockets.
 */
export async function diagnose(connection: Connection): Promise<Diagnosis | undefined> {
  let endpoint;
  try {
    endpoint = parseAddress(connection.address);
  } catch {
    return undefined;
  }
  if (endpoint.kind !== "tcp") return undefined;
  const host = endpoint.host.replace(/^\[(.*)\]$/, "$1");
  const tls = connection.tls;
  // A plaintext client needs to know only whether the port speaks TLS.
  const finding = await probe(host, endpoint.port, { serverName: tls?.serverName, plaintext: Boolean(tls) });
  const address = connection.address;
  if (!tls && finding === "tls") {
    return {
      reason: Reason.TLS_REQUIRED,
      message:
        `the daemon at ${address} speaks TLS, but this client connects in plaintext: turn TLS on ` +
        `with the CA that signed the daemon's certificate (option tls: { caFile: FILE }, or ` +
        `STRATAD_TLS_CA=FILE; tls: true, or STRATAD_TLS=true, if Node trusts it)`,
    };
  }
  if (!tls && finding === "tls-client-certificate") {
    return {
      reason: Reason.TLS_REQUIRED,
      message:
        `the daemon at ${address} speaks TLS and requires a client certificate (mTLS), but this ` +
        `client connects in plaintext: turn TLS on with the CA that signed the daemon's ` +
        `certificate and a client certificate and key (option tls: { caFile, certFile, keyFile }, ` +
        `or STRATAD_TLS_CA, STRATAD_TLS_CERT and STRATAD_TLS_KEY)`,
    };
  }
  if (tls && !tls.certFile && finding === "tls-client-certificate") {
    return {
      reason: Reason.CLIENT_CERT_REQUIRED,
      message:
        `the daemon at ${address} requires a client certificate (mTLS), but this client presents ` +
        `none: give a certificate signed by the daemon's client CA, and its key (option ` +
        `tls: { caFile, certFile: FILE, keyFile: FILE }, or STRATAD_TLS_CERT and STRATAD_TLS_KEY)`,
    };
  }
  if (tls && finding === "plaintext-http2") {
    return {
      reason: Reason.TLS_NOT_SUPPORTED,
      message:
        `the daemon at ${address} does not speak TLS (it answered in plaintext HTTP/2), but this ` +
        `client connects with TLS: drop the TLS settings, or dial the daemon's TLS listener ` +
        `(option tls: false, or unset STRATAD_TLS, STRATAD_TLS_CA, STRATAD_TLS_CERT and STRATAD_TLS_KEY)`,
    };
  }
  return undefined;
}

/**
 * `error`, or (a call that failed UNAVAILABLE before reaching the daemon,
 * because of a TLS mismatch) an error with the same code whose message names
 * the fix and whose ErrorInfo carries the reason.
 */
export async function explain(error: ConnectError, connection: Connection): Promise<ConnectError> {
  if (error.code !== Code.Unavailable) return error;
  // A daemon's own UNAVAILABLE (SHUTTING_DOWN...) carries an ErrorInfo, as does an explained error.
  if (error.findDetails(ErrorInfoSchema).some((info) => info.domain === ERROR_DOMAIN)) return error;
  const diagnosis = await diagnose(connection);
  if (!diagnosis) return error;
  const said = error.rawMessage ? ` (the connection failed with: ${error.rawMessage.trim()})` : "";
  const info = { reason: diagnosis.reason, domain: ERROR_DOMAIN, metadata: { address: connection.address } };
  return new ConnectError(
    diagnosis.message + said,
    Code.Unavailable,
    error.metadata,
    [{ desc: ErrorInfoSchema, value: info }],
    error.cause ?? error,
  );
}

/**
 * Explains calls that fail UNAVAILABLE (outside the retries: once per failed
 * call) when a TLS mismatch is the cause. For unix sockets it does nothing.
 */
export function diagnoseInterceptor(connection: Connection): Interceptor {
  const tcp = !connection.address.startsWith("unix:");
  return (next) => async (request) => {
    if (!tcp) return next(request);
    try {
      return await next(request);
    } catch (thrown) {
      // Streams (never retried) come here unconverted: to connect, a failed TLS
      // handshake is INTERNAL and a connection the peer dropped CANCELED.
      const failure = asUnavailable(asTransportFailure(ConnectError.from(thrown)), request.signal);
      const explained = await explain(failure, connection);
      throw explained === failure ? thrown : explained;
    }
  };
}
