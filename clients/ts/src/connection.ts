/**
 * Where the client connects and with which credentials, from options or the
 * environment. Mirrors the Python SDK (`stratad.sdk.connection`): an option
 * that is undefined or empty falls back to its variable.
 *
 * | variable                     | meaning                                                        |
 * |------------------------------|----------------------------------------------------------------|
 * | `STRATAD_ADDRESS`            | `HOST:PORT` or `unix:/path` (default `127.0.0.1:50051`)         |
 * | `STRATAD_TENANT`             | the tenant to act in (auth off, or an admin)                   |
 * | `STRATAD_TOKEN`              | bearer token, sent as `authorization: Bearer ...`              |
 * | `STRATAD_TOKEN_FILE`         | a file holding the token (a mounted secret)                    |
 * | `STRATAD_TLS`                | `true`: TLS with Node's default CA certificates                 |
 * | `STRATAD_TLS_CA`             | PEM CA file to verify the daemon with (implies TLS)            |
 * | `STRATAD_TLS_CERT` / `_KEY`  | client certificate and key for mTLS (imply TLS)                |
 * | `STRATAD_TLS_SERVER_NAME`    | the name the daemon's certificate must carry, when it is not the host dialed |
 */
import { readFileSync } from "node:fs";
import { homedir } from "node:os";

export const DEFAULT_ADDRESS = "127.0.0.1:50051";
export const TENANT_HEADER = "x-stratad-tenant";
export const AUTHORIZATION_HEADER = "authorization";

export const ADDRESS_ENV = "STRATAD_ADDRESS";
export const TENANT_ENV = "STRATAD_TENANT";
export const TOKEN_ENV = "STRATAD_TOKEN";
export const TOKEN_FILE_ENV = "STRATAD_TOKEN_FILE";
export const TLS_ENV = "STRATAD_TLS";
export const TLS_CA_ENV = "STRATAD_TLS_CA";
export const TLS_CERT_ENV = "STRATAD_TLS_CERT";
export const TLS_KEY_ENV = "STRATAD_TLS_KEY";
export const TLS_SERVER_NAME_ENV = "STRATAD_TLS_SERVER_NAME";

const TRUE_WORDS = new Set(["1", "true", "yes", "on"]);

/** How to verify the daemon and (mTLS) the certificate to show it. Paths to PEM files. */
export interface TlsOptions {
  /** CA certificates the daemon's certificate must chain to; unset = Node's default CAs. */
  caFile?: string;
  /** Client certificate and its key, for a daemon that requires mTLS. */
  certFile?: string;
  keyFile?: string;
  /** The name to check the daemon's certificate for, instead of the host dialed. */
  serverName?: string;
}

export type Environment = Record<string, string | undefined>;

export interface ConnectionOptions {
  /** `HOST:PORT`, `[IPv6]:PORT` or `unix:/path/to/socket`. */
  address?: string;
  tenant?: string;
  token?: string;
  /**
   * TlsOptions; `true` (TLS, settings from the environment or Node's default
   * CAs); `false` (plaintext whatever the environment says); undefined (TLS
   * if a STRATAD_TLS* variable asks for it).
   */
  tls?: TlsOptions | boolean;
  /** Where to read STRATAD_* from (default: process.env). */
  env?: Environment;
}

/** A resolved address, tenant, token and TLS: what the client dials with. */
export interface Connection {
  address: string;
  tenant: string;
  token: string;
  tls: TlsOptions | null;
}

/** Options first; what is undefined or empty comes from the environment. */
export function resolveConnection(options: ConnectionOptions = {}): Connection {
  const env = options.env ?? process.env;
  return {
    address: options.address || env[ADDRESS_ENV] || DEFAULT_ADDRESS,
    tenant: options.tenant || env[TENANT_ENV] || "",
    token: options.token || tokenFrom(env),
    tls: tlsFrom(options.tls, env),
  };
}

/** The headers every call carries: tenant and bearer token, when set. */
export function callHeaders(connection: Connection): Record<string, string> {
  const headers: Record<string, string> = {};
  if (connection.tenant) headers[TENANT_HEADER] = connection.tenant;
  if (connection.token) headers[AUTHORIZATION_HEADER] = `Bearer ${connection.token}`;
  return headers;
}

function tokenFrom(env: Environment): string {
  const token = env[TOKEN_ENV] ?? "";
  const file = env[TOKEN_FILE_ENV];
  if (token || !file) return token;
  // A mounted secret usually ends with a newline that is not part of the token.
  return readFileSync(expandHome(file), "utf8").trim();
}

function tlsFromEnv(env: Environment): TlsOptions | null {
  const caFile = env[TLS_CA_ENV] ?? "";
  const certFile = env[TLS_CERT_ENV] ?? "";
  const keyFile = env[TLS_KEY_ENV] ?? "";
  const serverName = env[TLS_SERVER_NAME_ENV] ?? "";
  const asked = TRUE_WORDS.has((env[TLS_ENV] ?? "").toLowerCase());
  if (!(caFile || certFile || keyFile || asked)) return null;
  return { caFile, certFile, keyFile, serverName };
}

function tlsFrom(tls: TlsOptions | boolean | undefined, env: Environment): TlsOptions | null {
  let resolved: TlsOptions | null;
  if (typeof tls === "object") resolved = tls;
  else if (tls === false) resolved = null;
  else if (tls === true) resolved = tlsFromEnv(env) ?? {};
  else resolved = tlsFromEnv(env);
  if (resolved && Boolean(resolved.certFile) !== Boolean(resolved.keyFile)) {
    throw new Error("a client certificate needs its key: give certFile and keyFile");
  }
  return resolved;
}

/** A parsed address: a TCP host and port, or a unix socket path. */
export type Endpoint = { kind: "tcp"; host: string; port: number } | { kind: "unix"; path: string };

export function parseAddress(address: string): Endpoint {
  if (address.startsWith("unix:")) {
    // unix:/abs/path, unix:///abs/path (gRPC's form) or unix:relative/path
    const path = address.slice("unix:".length).replace(/^\/\/(?=\/)/, "");
    if (!path) throw new Error(`address ${JSON.stringify(address)} names no socket path`);
    return { kind: "unix", path: expandHome(path) };
  }
  const match = /^(\[[0-9a-fA-F:.]+\]|[^:[\]/]+):(\d{1,5})$/.exec(address);
  const port = match ? Number(match[2]) : NaN;
  if (!match || port < 1 || port > 65535) {
    throw new Error(`address ${JSON.stringify(address)} is not HOST:PORT or unix:/path`);
  }
  return { kind: "tcp", host: match[1]!, port };
}

function expandHome(path: string): string {
  return path === "~" || path.startsWith("~/") ? homedir() + path.slice(1) : path;
}
