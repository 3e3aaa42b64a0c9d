"""Daemon configuration: one typed `Config`, loaded from four layers.

Precedence, highest first: command-line flags > ``STRATAD_*`` environment
variables > the TOML config file (``--config`` / ``STRATAD_CONFIG``) >
defaults. The file is flat: its top-level keys are the field names of
`Config` (``data_dir = "/var/lib/stratad"``). Every value, whatever layer it
comes from, goes through the same parser, so an invalid value is reported the
same way everywhere: as a `ConfigError` naming the key and where it came from.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast

from stratad.errors import InvalidArgumentError

LogLevel = Literal["debug", "info", "warning", "error", "critical"]
LogFormat = Literal["text", "json"]
Durability = Literal["fsync", "interval", "none"]
Replication = Literal["off", "async", "sync"]
AuthMode = Literal["off", "token", "mtls", "token_or_mtls"]
EncryptionMode = Literal["off", "on"]
TracingMode = Literal["off", "otlp", "console"]
FrontMode = Literal["auto", "native", "python"]

LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS: Final = ("text", "json")
DURABILITY_MODES: Final = ("fsync", "interval", "none")
REPLICATION_MODES: Final = ("off", "async", "sync")
AUTH_MODES: Final = ("off", "token", "mtls", "token_or_mtls")
ENCRYPTION_MODES: Final = ("off", "on")
TRACING_MODES: Final = ("off", "otlp", "console")
FRONT_MODES: Final = ("auto", "native", "python")
ENV_PREFIX: Final = "STRATAD_"
CONFIG_FILE_ENV: Final = "STRATAD_CONFIG"
MIB: Final = 1024 * 1024
# gRPC message-size options are C ints.
MAX_GRPC_MESSAGE_BYTES: Final = 2**31 - 1


class ConfigError(InvalidArgumentError):
    """A configuration file, variable or flag is unknown or has an invalid value."""


@dataclass(frozen=True, slots=True)
class Config:
    """Everything `stratad serve` can be told. Field names are the TOML keys."""

    listen: str = "127.0.0.1:50051"
    listen_unix: str = ""
    front: FrontMode = "auto"
    data_dir: Path = Path("./stratad-data")
    log_level: LogLevel = "info"
    log_format: LogFormat = "text"
    grace_period: float = 10.0
    max_message_bytes: int = 64 * MIB
    max_concurrent_rpcs: int = 256
    max_inflight_bytes: int = 256 * MIB
    max_connections: int = 1000
    max_streams_per_connection: int = 1024
    connection_idle_timeout: float = 300.0
    max_header_bytes: int = 16 * 1024
    max_tenant_stored_bytes: int = 0
    max_tenant_sessions: int = 0
    max_session_checkpoints: int = 0
    durability: Durability = "fsync"
    fsync_interval_ms: int = 100
    metrics_listen: str = "127.0.0.1:9464"
    metrics_stats_interval: float = 30.0
    metrics_tenant_labels: int = 0
    replication: Replication = "off"
    remote_url: str = ""
    replication_lag_ms: int = 1000
    replication_lease_ms: int = 10_000
    replication_gc_grace_seconds: float = 3600.0
    node_id: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    allow_insecure: bool = False
    auth: AuthMode = "off"
    auth_tokens_file: str = ""
    reflection: bool = True
    encryption: EncryptionMode = "off"
    encryption_key_file: str = ""
    encryption_old_key_files: tuple[str, ...] = ()
    inspector_listen: str = ""
    session_idle_ttl: float = 0.0
    lifecycle_sweep_interval: float = 60.0
    gc_interval: float = 0.0
    tracing: TracingMode = "off"
    otlp_endpoint: str = ""
    otlp_insecure: bool = False
    trace_sample_ratio: float = 1.0
    trace_service_name: str = ""

    def __post_init__(self) -> None:
        # Code (tests, embedders) may build a Config directly: hold it to the
        # same rules as one loaded from flags, environment or file.
        for option in OPTIONS:
            value = _parse_value(option, getattr(self, option.name), "Config field")
            object.__setattr__(self, option.name, value)
        if self.replication != "off" and not self.remote_url:
            raise ConfigError(f"replication = {self.replication!r} needs a remote_url")
        _check_security(self)

    @property
    def is_unix_socket(self) -> bool:
        return self.listen.startswith("unix:")

    @property
    def tls(self) -> bool:
        """Whether the TCP listener serves TLS (the unix socket never does)."""
        return bool(self.tls_cert_file)

    @property
    def native_front(self) -> bool:
        """Whether the native front door serves the listeners (TCP, TLS and
        unix sockets alike); ``front = python``: grpc.aio does."""
        return self.front != "python"

    @property
    def plaintext_exposed(self) -> bool:
        """Plaintext gRPC on a TCP address other hosts may reach."""
        return not self.tls and not self.is_unix_socket and not is_loopback(self.listen)

    @property
    def inspector_exposed(self) -> bool:
        """The web inspector (plain HTTP) on an address other hosts may reach."""
        return bool(self.inspector_listen) and not is_loopback(self.inspector_listen)


def _check_security(config: Config) -> None:
    """The rules that tie the TLS and auth keys together (see docs/security.md)."""
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        raise ConfigError("tls_cert_file and tls_key_file go together: set both or neither")
    if config.tls_client_ca_file and not config.tls:
        raise ConfigError("tls_client_ca_file (mTLS) needs tls_cert_file and tls_key_file")
    if config.auth != "off" and not config.auth_tokens_file:
        raise ConfigError(f"auth = {config.auth!r} needs auth_tokens_file")
    if config.auth in ("mtls", "token_or_mtls") and not config.tls_client_ca_file:
        raise ConfigError(
            f"auth = {config.auth!r} identifies clients by certificate: set tls_client_ca_file"
        )
    if config.encryption_old_key_files and config.encryption != "on":
        raise ConfigError("encryption_old_key_files (key rotation) needs encryption = on")
    if config.plaintext_exposed and not config.allow_insecure:
        raise ConfigError(
            f"listen = {config.listen!r} would serve plaintext gRPC beyond this host: "
            "set tls_cert_file and tls_key_file, listen on 127.0.0.1 or a unix socket, "
            "or set allow_insecure = true if the network is otherwise closed "
            "(a pod behind a NetworkPolicy)"
        )
    if config.inspector_exposed and not config.allow_insecure:
        raise ConfigError(
            f"inspector_listen = {config.inspector_listen!r} would serve the web inspector "
            "(plain HTTP, every tenant's data) beyond this host: listen on 127.0.0.1 and "
            "reach it through a tunnel (ssh -L, kubectl port-forward), or set "
            "allow_insecure = true if the network is otherwise closed"
        )


def is_loopback(listen: str) -> bool:
    """Whether a HOST:PORT listen address only accepts connections from this host.

    Host names other than ``localhost`` count as reachable: they may resolve
    to any interface.
    """
    host = listen.rpartition(":")[0].removeprefix("[").removesuffix("]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- value parsers ----------------------------------------------------------
# Each takes a raw value (a str from a flag or the environment, or a typed
# TOML value) and returns the typed value or raises ValueError with a reason.

Parser = Callable[[object], Any]


def _parse_str(raw: object) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"expected a string, got {type(raw).__name__}")
    return raw


def _parse_listen(raw: object) -> str:
    value = _parse_str(raw).strip()
    if value.startswith("unix:"):
        if not value.removeprefix("unix:").lstrip("/"):
            raise ValueError("a unix socket address needs a path, e.g. unix:/run/stratad.sock")
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError("expected HOST:PORT or unix:/path")
    bracketed = host.startswith("[") and host.endswith("]")
    if not bracketed and (":" in host or "[" in host or "]" in host):
        raise ValueError("an IPv6 host must be in brackets, e.g. [::1]:50051")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be a number from 0 to 65535, got {port!r}")
    return value


#: Values that turn an optional listener off ("" cannot be given through the
#: environment, where an empty variable means "not set").
_OFF: Final = ("", "off", "none")


def _parse_unix_path(raw: object) -> str:
    """A socket path (``/run/s.sock`` or ``unix:/run/s.sock``) as a ``unix:`` address; "" = off."""
    value = _parse_str(raw).strip()
    if value.lower() in _OFF:
        return ""
    path = value.removeprefix("unix:")
    if not path.lstrip("/"):
        raise ValueError("expected a socket path, e.g. /run/stratad/stratad.sock")
    if path.startswith("//"):  # unix:///abs/path
        path = path[2:]
    return "unix:" + path


def _parse_metrics_listen(raw: object) -> str:
    """HOST:PORT for the Prometheus endpoint; "", "off" or "none" turn it off."""
    value = _parse_str(raw).strip()
    if value.lower() in _OFF:
        return ""
    if value.startswith("unix:"):
        raise ValueError("the metrics endpoint is HTTP on TCP: expected HOST:PORT, or off")
    return _parse_listen(value)


def _parse_inspector_listen(raw: object) -> str:
    """HOST:PORT for the web inspector; "", "off" or "none" (the default) turn it off."""
    value = _parse_str(raw).strip()
    if value.lower() in _OFF:
        return ""
    if value.startswith("unix:"):
        raise ValueError("the inspector is HTTP on TCP: expected HOST:PORT, or off")
    return _parse_listen(value)


def _parse_otlp_endpoint(raw: object) -> str:
    """An OTLP/gRPC collector: http(s)://HOST:PORT or HOST:PORT; "" = the OTEL_* variables."""
    value = _parse_str(raw).strip()
    if not value:
        return ""
    scheme, sep, rest = value.partition("://")
    if sep and scheme not in ("http", "https"):
        raise ValueError(f"expected http://HOST:PORT, https://HOST:PORT or HOST:PORT; got {raw!r}")
    address = (rest if sep else value).rstrip("/")
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"expected http://HOST:PORT, https://HOST:PORT or HOST:PORT; got {raw!r}")
    return value


def _parse_remote_url(raw: object) -> str:
    value = _parse_str(raw).strip()
    if value.lower() in _OFF:
        return ""
    scheme, sep, rest = value.partition("://")
    if not sep or not scheme or not rest:
        raise ValueError("expected a URL such as s3://bucket/prefix or file:///path")
    return value


def _parse_file_list(raw: object) -> tuple[str, ...]:
    """File paths: a TOML list, or one string separated by commas ("" = none)."""
    if isinstance(raw, (list, tuple)):
        items = [_parse_file(item) for item in raw]
    else:
        items = [_parse_file(item) for item in _parse_str(raw).split(",")]
    return tuple(item for item in items if item)


def _parse_node_id(raw: object) -> str:
    value = _parse_str(raw).strip()
    if len(value) > 128 or any(not (ch.isalnum() or ch in "-_.:") for ch in value):
        raise ValueError("at most 128 letters, digits and - _ . :")
    return value


def _parse_file(raw: object) -> str:
    """An optional file path: "" (or off/none) = not set."""
    value = (str(raw) if isinstance(raw, Path) else _parse_str(raw)).strip()
    if value.lower() in _OFF:
        return ""
    return str(Path(value).expanduser())


_TRUE: Final = ("true", "yes", "on", "1")
_FALSE: Final = ("false", "no", "off", "0")


def _parse_bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    value = _parse_str(raw).strip().lower() if isinstance(raw, str) else None
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"expected true or false, got {raw!r}")


_DURATION_UNITS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _parse_duration(raw: object) -> float:
    """Seconds, as a number or a string with a unit (90s, 30m, 12h, 7d); 0 or off = off."""
    if isinstance(raw, str) and raw.strip().lower() in _OFF:
        return 0.0
    text = raw.strip().lower() if isinstance(raw, str) else raw
    try:
        unit = _DURATION_UNITS.get(text[-1:]) if isinstance(text, str) else None
        number = _coerce_number(float, text[:-1] if unit is not None else text)  # type: ignore[index]
    except ValueError:
        raise ValueError(_DURATION_HINT.format(raw=raw)) from None
    seconds = float(number) * (unit or 1.0)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(_DURATION_HINT.format(raw=raw))
    return seconds


def _parse_positive_duration(raw: object) -> float:
    seconds = _parse_duration(raw)
    if seconds <= 0:
        raise ValueError(f"must be more than 0; got {raw!r}")
    return seconds


_DURATION_HINT: Final = (
    "expected a duration of 0 or more: seconds, or 90s, 30m, 12h, 7d; got {raw!r}"
)


def _parse_path(raw: object) -> Path:
    value = str(raw) if isinstance(raw, Path) else _parse_str(raw)
    if not value:
        raise ValueError("must not be empty")
    return Path(value).expanduser()


def _choice(*allowed: str) -> Parser:
    def parse(raw: object) -> str:
        value = _parse_str(raw).strip().lower()
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}; got {raw!r}")
        return value

    return parse


def _number(kind: type[int] | type[float], minimum: float, maximum: float | None = None) -> Parser:
    def parse(raw: object) -> int | float:
        value = _coerce_number(kind, raw)
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number; got {raw!r}")
        if value < minimum:
            raise ValueError(f"must be >= {_show(minimum)}; got {raw!r}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be <= {_show(maximum)}; got {raw!r}")
        return value

    return parse


def _show(bound: float) -> str:
    return f"{bound:,.0f}" if float(bound).is_integer() else str(bound)


def _coerce_number(kind: type[int] | type[float], raw: object) -> int | float:
    # bool is an int subclass: `grace_period = true` in TOML is a mistake.
    if isinstance(raw, bool):
        raise ValueError(f"expected a number, got {raw!r}")
    if isinstance(raw, int) or (kind is float and isinstance(raw, float)):
        return kind(raw)
    if isinstance(raw, str):
        try:
            return kind(raw.strip())
        except ValueError:
            pass
    noun = "an integer" if kind is int else "a number"
    raise ValueError(f"expected {noun}, got {raw!r}")


# --- the option table ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Option:
    """One config key: how to parse it and how to document it."""

    name: str
    parse: Parser
    help: str
    metavar: str

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def default(self) -> object:
        field = next(f for f in dataclasses.fields(Config) if f.name == self.name)
        return field.default


OPTIONS: Final[tuple[Option, ...]] = (
    Option(
        "listen",
        _parse_listen,
        "address to serve gRPC on: HOST:PORT (port 0 picks a free port) or unix:/path",
        "ADDR",
    ),
    Option(
        "listen_unix",
        _parse_unix_path,
        "also serve gRPC on this unix socket path (for clients in the same pod or host), "
        "besides listen; empty or off = no second listener",
        "PATH",
    ),
    Option(
        "front",
        _choice(*FRONT_MODES),
        "who serves gRPC on every listener (TCP plaintext or TLS, unix sockets): "
        "native (the Rust front door: HTTP/2 and gRPC framing off the Python GIL, "
        "the edge limits of docs/security.md, docs/design.md), python (grpc.aio, "
        "without those limits) or auto (native)",
        "MODE",
    ),
    Option(
        "data_dir",
        _parse_path,
        "data directory; created if missing, locked while the daemon runs",
        "DIR",
    ),
    Option("log_level", _choice(*LOG_LEVELS), "log level: " + ", ".join(LOG_LEVELS), "LEVEL"),
    Option(
        "log_format",
        _choice(*LOG_FORMATS),
        "log format: text or json (one JSON object a line)",
        "FMT",
    ),
    Option(
        "grace_period",
        _number(float, 0),
        "seconds in-flight calls get to finish after SIGTERM/SIGINT",
        "SECONDS",
    ),
    Option(
        "max_message_bytes",
        _number(int, 1, MAX_GRPC_MESSAGE_BYTES),
        "largest gRPC message accepted or sent, in bytes",
        "BYTES",
    ),
    Option(
        "max_concurrent_rpcs",
        _number(int, 0, MAX_GRPC_MESSAGE_BYTES),
        "calls served at once (watch streams included) before new ones get "
        "RESOURCE_EXHAUSTED; 0 = no limit",
        "N",
    ),
    Option(
        "max_connections",
        _number(int, 0, 1_000_000),
        "client connections open at once on the TCP listener; more are closed at once; "
        "never more than half the open-file limit leaves after 256 (0 = that bound)",
        "N",
    ),
    Option(
        "max_streams_per_connection",
        _number(int, 1, 2**31 - 1),
        "concurrent calls one connection may open (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS)",
        "N",
    ),
    Option(
        "connection_idle_timeout",
        _number(float, 0.001),
        "seconds a connection may stay without a call before it is closed (GOAWAY)",
        "SECONDS",
    ),
    Option(
        "max_header_bytes",
        _number(int, 1024, 256 * 1024),
        "largest metadata (header list) of a call, in bytes; RESOURCE_EXHAUSTED above",
        "BYTES",
    ),
    Option(
        "max_inflight_bytes",
        _number(int, 0),
        "memory budget of the requests being processed; a request that does not fit gets "
        "RESOURCE_EXHAUSTED (reason OVERLOADED, retryable); 0 = no budget",
        "BYTES",
    ),
    Option(
        "max_tenant_stored_bytes",
        _number(int, 0),
        "quota: bytes a tenant's sessions may keep on disk (objects and journals); 0 = no quota",
        "BYTES",
    ),
    Option(
        "max_tenant_sessions",
        _number(int, 0),
        "quota: sessions a tenant may have; 0 = no quota",
        "N",
    ),
    Option(
        "max_session_checkpoints",
        _number(int, 0),
        "quota: checkpoints one session may hold (retention drops count); 0 = no quota",
        "N",
    ),
    Option(
        "durability",
        _choice(*DURABILITY_MODES),
        "when writes reach the disk: fsync (before every acknowledgement), "
        "interval (every fsync_interval_ms) or none (left to the OS)",
        "MODE",
    ),
    Option(
        "fsync_interval_ms",
        _number(int, 1),
        "milliseconds between fsyncs in durability mode 'interval'",
        "MS",
    ),
    Option(
        "metrics_listen",
        _parse_metrics_listen,
        "HOST:PORT of the Prometheus metrics endpoint (HTTP, path /metrics); "
        "empty or off = no metrics endpoint",
        "ADDR",
    ),
    Option(
        "metrics_stats_interval",
        _number(float, 0),
        "seconds a computed set of store metrics (bytes, dedup ratio, objects) is reused "
        "before a scrape computes it again; 0 = on every scrape",
        "SECONDS",
    ),
    Option(
        "metrics_tenant_labels",
        _number(int, 0),
        "label per-tenant metrics (GC, Verify) with the first N tenants seen; the others "
        'are counted under tenant="_other"; 0 = no tenant names in metrics',
        "N",
    ),
    Option(
        "replication",
        _choice(*REPLICATION_MODES),
        "replicate sessions to object storage (remote_url): off, async (shipped within "
        "replication_lag_ms) or sync (acknowledged once in object storage)",
        "MODE",
    ),
    Option(
        "remote_url",
        _parse_remote_url,
        "object storage for replication: s3://bucket/prefix, gs://..., az://..., file:///dir; "
        "credentials and endpoint from the standard AWS_*/GOOGLE_*/AZURE_* variables",
        "URL",
    ),
    Option(
        "replication_lag_ms",
        _number(int, 1),
        "async replication: milliseconds between shipments (the loss window)",
        "MS",
    ),
    Option(
        "replication_lease_ms",
        _number(int, 100),
        "how long a daemon's ownership of a session lasts without a write",
        "MS",
    ),
    Option(
        "replication_gc_grace_seconds",
        _number(float, 0),
        "CollectGarbage in object storage: seconds between condemning an unreferenced pack "
        "and deleting it; longer than any daemon may hold writes it has not shipped (also: "
        "a daemon silent this long has its library streams adopted)",
        "SECONDS",
    ),
    Option(
        "node_id",
        _parse_node_id,
        "this daemon's name in session leases; default: host name and process ID",
        "NAME",
    ),
    Option(
        "tls_cert_file",
        _parse_file,
        "PEM certificate (chain) the TCP listener serves TLS with; re-read when it changes; "
        "empty = plaintext",
        "FILE",
    ),
    Option(
        "tls_key_file",
        _parse_file,
        "PEM private key of tls_cert_file; re-read when it changes",
        "FILE",
    ),
    Option(
        "tls_client_ca_file",
        _parse_file,
        "mTLS: PEM CA certificates; TLS clients must present a certificate one of them "
        "signed; re-read when it changes; empty = no client certificates",
        "FILE",
    ),
    Option(
        "allow_insecure",
        _parse_bool,
        "allow plaintext gRPC on a non-loopback listen address (without TLS), and the web "
        "inspector on a non-loopback inspector_listen",
        "BOOL",
    ),
    Option(
        "auth",
        _choice(*AUTH_MODES),
        "who may call: off (anyone; tenant from x-stratad-tenant), token (bearer tokens), "
        "mtls (client certificates) or token_or_mtls; identities in auth_tokens_file",
        "MODE",
    ),
    Option(
        "auth_tokens_file",
        _parse_file,
        "TOML or JSON file mapping token SHA-256 digests and client certificate names to "
        "tenant and role; re-read when it changes",
        "FILE",
    ),
    Option(
        "reflection",
        _parse_bool,
        "serve gRPC server reflection (with auth on, to authenticated callers only)",
        "BOOL",
    ),
    Option(
        "inspector_listen",
        _parse_inspector_listen,
        "HOST:PORT of the read-only web inspector (HTTP: sessions, checkpoint trees and "
        "diffs, structured state, crystals of every tenant; with auth on it asks for an "
        "admin bearer token); empty or off = no inspector",
        "ADDR",
    ),
    Option(
        "session_idle_ttl",
        _parse_duration,
        "delete a session nobody wrote or loaded for this long (seconds, or 90s, 30m, 12h, "
        "7d); a session labelled stratad.dev/keep=true is kept; 0 or off = never",
        "DURATION",
    ),
    Option(
        "lifecycle_sweep_interval",
        _parse_positive_duration,
        "how often idle sessions are looked for (session_idle_ttl); must be > 0",
        "DURATION",
    ),
    Option(
        "gc_interval",
        _parse_duration,
        "collect garbage in every tenant this often (with up to 10% jitter), as "
        "CollectGarbage does; 0 or off = only when asked",
        "DURATION",
    ),
    Option(
        "tracing",
        _choice(*TRACING_MODES),
        "OpenTelemetry tracing (needs the otel extra): off, otlp (export to otlp_endpoint "
        "over OTLP/gRPC) or console (spans as JSON on stdout)",
        "MODE",
    ),
    Option(
        "otlp_endpoint",
        _parse_otlp_endpoint,
        "OTLP/gRPC collector for tracing = otlp: http://HOST:PORT (plaintext), "
        "https://HOST:PORT (TLS) or HOST:PORT; empty = OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "
        "else OTEL_EXPORTER_OTLP_ENDPOINT, else http://127.0.0.1:4317",
        "URL",
    ),
    Option(
        "otlp_insecure",
        _parse_bool,
        "plaintext to an otlp_endpoint given without a scheme (http:// is always plaintext, "
        "https:// always TLS)",
        "BOOL",
    ),
    Option(
        "trace_sample_ratio",
        _number(float, 0, 1),
        "fraction of traces started here that are recorded (0 to 1); a call that comes "
        "with a sampled traceparent is always recorded",
        "RATIO",
    ),
    Option(
        "trace_service_name",
        _parse_str,
        "service.name of the spans; empty = OTEL_SERVICE_NAME, else stratad",
        "NAME",
    ),
    Option(
        "encryption",
        _choice(*ENCRYPTION_MODES),
        "encryption at rest: on seals every stored object and journal record with a "
        "per-tenant data key wrapped by the master key (encryption_key_file or "
        "STRATAD_ENCRYPTION_KEY)",
        "MODE",
    ),
    Option(
        "encryption_key_file",
        _parse_file,
        "file holding the 256-bit master key (64 hex digits or base64); "
        "STRATAD_ENCRYPTION_KEY may hold the key itself instead",
        "FILE",
    ),
    Option(
        "encryption_old_key_files",
        _parse_file_list,
        "key rotation: earlier master keys (comma-separated files); tenants' data keys "
        "wrapped by one of them are re-wrapped with the current key at start",
        "FILES",
    ),
)
OPTIONS_BY_NAME: Final = {option.name: option for option in OPTIONS}


# --- loading ------------------------------------------------------------------


def load_config(
    flags: Mapping[str, object | None] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: Path | str | None = None,
) -> Config:
    """Build a `Config` from flags > environment > config file > defaults.

    ``flags`` maps option names to raw values, None meaning "not given" (as
    argparse reports an absent flag). ``config_file`` defaults to
    ``STRATAD_CONFIG`` from ``environ``. Raises `ConfigError`.
    """
    flags = flags or {}
    environ = environ if environ is not None else {}
    if config_file is None:
        config_file = environ.get(CONFIG_FILE_ENV) or None
    values: dict[str, object] = {}
    if config_file is not None:
        values.update(_from_file(Path(config_file)))
    values.update(_from_env(environ))
    values.update(_from_flags(flags))
    return Config(**cast(dict[str, Any], values))


def _parse_value(option: Option, raw: object, source: str) -> object:
    try:
        return option.parse(raw)
    except ValueError as exc:
        raise ConfigError(f"invalid value for {option.name} ({source}): {exc}") from None


def _from_flags(flags: Mapping[str, object | None]) -> dict[str, object]:
    values = {}
    for name, raw in flags.items():
        if raw is None:
            continue
        option = OPTIONS_BY_NAME.get(name)
        if option is None:
            raise ConfigError(f"unknown config option {name!r}")
        values[name] = _parse_value(option, raw, f"flag {option.flag}")
    return values


def _from_env(environ: Mapping[str, str]) -> dict[str, object]:
    # Unknown STRATAD_* variables are ignored, not rejected: clients share the
    # prefix (e.g. an SDK's STRATAD_TENANT) and may run in the same environment.
    values = {}
    for option in OPTIONS:
        raw = environ.get(option.env_var)
        if raw is not None and raw != "":
            values[option.name] = _parse_value(option, raw, f"environment {option.env_var}")
    return values


def _from_file(path: Path) -> dict[str, object]:
    try:
        with path.open("rb") as f:
            document = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    values = {}
    for key, raw in document.items():
        option = OPTIONS_BY_NAME.get(key)
        if option is None:
            known = ", ".join(OPTIONS_BY_NAME)
            raise ConfigError(f"unknown key {key!r} in config file {path} (known keys: {known})")
        values[key] = _parse_value(option, raw, f"config file {path}")
    return values


__all__ = [
    "AUTH_MODES",
    "CONFIG_FILE_ENV",
    "OPTIONS",
    "AuthMode",
    "Config",
    "ConfigError",
    "Durability",
    "LogFormat",
    "LogLevel",
    "Option",
    "Replication",
    "TracingMode",
    "is_loopback",
    "load_config",
]
