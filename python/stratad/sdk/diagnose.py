"""Why a connection failed, when the client's and the daemon's TLS settings differ.

A plaintext client on a TLS listener, a TLS client without a certificate on an
mTLS listener and a TLS client on a plaintext listener all fail as UNAVAILABLE
with what the transport saw ("Socket closed", "connection error", "Unwrap
failed", "WRONG_VERSION_NUMBER"), which does not say what to change. So when a
call fails UNAVAILABLE without having reached the daemon (no stratad ErrorInfo),
after the channel's own retries, the client probes the address once:

- a TLS handshake with certificate verification off (only to learn whether the
  port speaks TLS), then one read: a daemon that requires a client certificate
  answers a client without one with a ``certificate_required`` alert there
  (TLS 1.3), or fails the handshake with an alert (TLS 1.2);
- if that port does not speak TLS, the HTTP/2 client preface in plaintext: a
  plaintext gRPC daemon answers with its SETTINGS frame.

When the finding explains the failure, the error keeps its UNAVAILABLE code but
its message names the fix, and it carries a `google.rpc.ErrorInfo` (domain
stratad.dev) whose reason `to_error` exposes: ``TLS_REQUIRED``,
``CLIENT_CERT_REQUIRED`` or ``TLS_NOT_SUPPORTED``. The probe is bounded by
`PROBE_TIMEOUT` and runs only on such a failure: never for a successful call,
never for a unix socket, and its finding is not kept (the next failure probes
again: the daemon may have restarted with other settings).
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from stratad.errors import ERROR_DOMAIN
from stratad.sdk.constants import TLS_CA_ENV, TLS_CERT_ENV, TLS_ENV, TLS_KEY_ENV

if TYPE_CHECKING:
    from collections.abc import Callable

    from stratad.sdk.tls import TLSConfig

#: The reasons of the errors this module explains.
TLS_REQUIRED = "TLS_REQUIRED"
CLIENT_CERT_REQUIRED = "CLIENT_CERT_REQUIRED"
TLS_NOT_SUPPORTED = "TLS_NOT_SUPPORTED"

#: The most a probe adds to a failed call, both connections included.
PROBE_TIMEOUT = 2.0

_STATUS_DETAILS_KEY = "grpc-status-details-bin"
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_H2_EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 0x04
#: Alerts a server sends a client that did not present the certificate it asked for.
_CERTIFICATE_ALERTS = ("CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE", "BAD_CERTIFICATE")


# --- what the port speaks -------------------------------------------------------------------


class Finding:
    """What the probe learned about the port (plain strings, for messages and tests)."""

    TLS = "tls"  # speaks TLS; serves a client without a certificate
    TLS_CLIENT_CERT = "tls-client-certificate"  # speaks TLS, refuses a client without one
    PLAINTEXT_H2 = "plaintext-http2"  # answered the HTTP/2 preface in plaintext
    UNKNOWN = "unknown"  # unreachable, silent, or something else


def tcp_endpoint(address: str) -> tuple[str, int] | None:
    """The host and port a gRPC target dials, or None (unix sockets, other schemes)."""
    rest = address
    if rest.startswith("dns://"):
        # dns:///host:port, or dns://resolver/host:port
        rest = rest[len("dns://") :].partition("/")[2]
    elif rest.startswith(("dns:", "ipv4:", "ipv6:")):
        rest = rest.partition(":")[2].split(",")[0]
    if rest.startswith("["):
        host, sep, port = rest[1:].partition("]:")
    else:
        host, sep, port = rest.rpartition(":")
        if ":" in host or "/" in host:
            return None
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def probe(
    host: str,
    port: int,
    *,
    server_name: str = "",
    timeout: float = PROBE_TIMEOUT,
    plaintext: bool = True,
) -> str:
    """Whether the port speaks TLS (and refuses a client without a certificate),
    or (``plaintext``: asked only when the port is not TLS) plaintext HTTP/2."""
    deadline = time.monotonic() + timeout
    finding = _probe_tls(host, port, server_name, deadline)
    if finding is not None:
        return finding
    if plaintext and _speaks_plaintext_h2(host, port, deadline):
        return Finding.PLAINTEXT_H2
    return Finding.UNKNOWN


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("probe deadline")
    return left


def _probe_tls(host: str, port: int, server_name: str, deadline: float) -> str | None:
    """A TLS finding; None when the port answered the handshake with something not TLS."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # what the port speaks, not whom it proves to be
    context.set_alpn_protocols(["h2"])
    try:
        raw = socket.create_connection((host, port), timeout=_left(deadline))
    except OSError:
        return Finding.UNKNOWN
    with raw:
        try:
            conn = context.wrap_socket(raw, server_hostname=server_name or host)
        except ssl.SSLError as exc:
            reason = exc.reason or ""
            if "ALERT" not in reason:
                return None  # WRONG_VERSION_NUMBER & co: the answer was no TLS record
            # An alert is TLS; in TLS 1.2 a server that wants a certificate fails here.
            if any(alert in reason for alert in _CERTIFICATE_ALERTS):
                return Finding.TLS_CLIENT_CERT
            return Finding.TLS
        except OSError:
            return Finding.UNKNOWN  # reset or silent: nothing to tell
        with conn:
            # TLS 1.3: the server checks the client's (empty) certificate after
            # the client finished; a refusal is the first thing it sends.
            try:
                conn.settimeout(_left(deadline))
                conn.recv(1)
            except ssl.SSLError as exc:
                if any(alert in (exc.reason or "") for alert in _CERTIFICATE_ALERTS):
                    return Finding.TLS_CLIENT_CERT
            except OSError:
                pass
            return Finding.TLS


def _speaks_plaintext_h2(host: str, port: int, deadline: float) -> bool:
    """Whether the port answers the HTTP/2 client preface with a SETTINGS frame."""
    try:
        with socket.create_connection((host, port), timeout=_left(deadline)) as conn:
            conn.sendall(_H2_PREFACE + _H2_EMPTY_SETTINGS)
            head = b""
            while len(head) < 9:
                conn.settimeout(_left(deadline))
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    return False
                head += chunk
    except OSError:
        return False
    # A frame header: length (3), type, flags, stream 0 for SETTINGS.
    return head[3] == _H2_SETTINGS and head[5:9] == b"\x00\x00\x00\x00"


# --- what the client should change ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """A TLS mismatch: its reason and the message that names the fix."""

    reason: str
    message: str
    address: str

    def details(self, original: str) -> str:
        """The error's message: the diagnosis, then what the transport said."""
        if not original:
            return self.message
        return f"{self.message} (the connection failed with: {original})"


def diagnose_address(
    address: str, tls: TLSConfig | None, *, timeout: float = PROBE_TIMEOUT
) -> Diagnosis | None:
    """Probe ``address`` and say which TLS setting to change, if one explains a failure."""
    endpoint = tcp_endpoint(address)
    if endpoint is None:
        return None
    host, port = endpoint
    # A plaintext client needs to know only whether the port speaks TLS.
    server_name = tls.server_name if tls else ""
    finding = probe(host, port, server_name=server_name, timeout=timeout, plaintext=tls is not None)
    if tls is None:
        if finding == Finding.TLS:
            return Diagnosis(TLS_REQUIRED, _tls_required(address, client_cert=False), address)
        if finding == Finding.TLS_CLIENT_CERT:
            return Diagnosis(TLS_REQUIRED, _tls_required(address, client_cert=True), address)
        return None
    if finding == Finding.TLS_CLIENT_CERT and not tls.cert_file:
        return Diagnosis(CLIENT_CERT_REQUIRED, _client_cert_required(address), address)
    if finding == Finding.PLAINTEXT_H2:
        return Diagnosis(TLS_NOT_SUPPORTED, _tls_not_supported(address), address)
    return None


def _tls_required(address: str, *, client_cert: bool) -> str:
    if client_cert:
        return (
            f"the daemon at {address} speaks TLS and requires a client certificate (mTLS), "
            "but this client connects in plaintext: turn TLS on with the CA that signed the "
            "daemon's certificate and a client certificate and key "
            "(stratad ctl: --tls-ca FILE --tls-cert FILE --tls-key FILE; "
            "Python: tls=stratad.TLSConfig(ca_file=..., cert_file=..., key_file=...); "
            f"environment: {TLS_CA_ENV}, {TLS_CERT_ENV} and {TLS_KEY_ENV})"
        )
    return (
        f"the daemon at {address} speaks TLS, but this client connects in plaintext: "
        "turn TLS on with the CA that signed the daemon's certificate "
        "(stratad ctl: --tls-ca FILE, or --tls if the system trusts it; "
        "Python: tls=stratad.TLSConfig(ca_file=FILE), or tls=True; "
        f"environment: {TLS_CA_ENV}=FILE, or {TLS_ENV}=true)"
    )


def _client_cert_required(address: str) -> str:
    return (
        f"the daemon at {address} requires a client certificate (mTLS), but this client "
        "presents none: give a certificate signed by the daemon's client CA, and its key "
        "(stratad ctl: --tls-cert FILE --tls-key FILE; "
        "Python: stratad.TLSConfig(ca_file=..., cert_file=FILE, key_file=FILE); "
        f"environment: {TLS_CERT_ENV} and {TLS_KEY_ENV})"
    )


def _tls_not_supported(address: str) -> str:
    return (
        f"the daemon at {address} does not speak TLS (it answered in plaintext HTTP/2), "
        "but this client connects with TLS: drop the TLS settings, or dial the daemon's "
        "TLS listener (stratad ctl: leave out --tls, --tls-ca, --tls-cert and --tls-key; "
        f"Python: tls=False; environment: unset {TLS_ENV}, {TLS_CA_ENV}, {TLS_CERT_ENV} "
        f"and {TLS_KEY_ENV})"
    )


# --- the errors -----------------------------------------------------------------------------


def may_explain(exc: grpc.RpcError, address: str) -> bool:
    """Whether a failed call is one a probe may explain: UNAVAILABLE without having
    reached the daemon (a daemon's own UNAVAILABLE, e.g. SHUTTING_DOWN, carries an
    ErrorInfo, as does an error explained already), on a TCP address."""
    if _code(exc) != grpc.StatusCode.UNAVAILABLE or _has_status_details(exc):
        return False
    return tcp_endpoint(address) is not None


def diagnose(exc: grpc.RpcError, address: str, tls: TLSConfig | None) -> Diagnosis | None:
    """A diagnosis for a failed call, when `may_explain` and a probe explains it."""
    return diagnose_address(address, tls) if may_explain(exc, address) else None


def explained(exc: grpc.RpcError, address: str, tls: TLSConfig | None) -> grpc.RpcError:
    """``exc``, or an error with the same code whose message names the fix."""
    diagnosis = diagnose(exc, address, tls)
    return exc if diagnosis is None else DiagnosedRpcError(exc, diagnosis)


def status_details(code: grpc.StatusCode, details: str, diagnosis: Diagnosis) -> bytes:
    """The ``grpc-status-details-bin`` value: a google.rpc.Status with the ErrorInfo."""
    info = error_details_pb2.ErrorInfo(
        reason=diagnosis.reason, domain=ERROR_DOMAIN, metadata={"address": diagnosis.address}
    )
    packed = any_pb2.Any()
    packed.Pack(info)
    status = status_pb2.Status(code=code.value[0], message=details, details=[packed])
    return status.SerializeToString()  # type: ignore[no-any-return]


def _code(exc: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(exc, "code", None)
    return code() if callable(code) else None


def _has_status_details(exc: grpc.RpcError) -> bool:
    trailers = getattr(exc, "trailing_metadata", None)
    metadata = trailers() if callable(trailers) else None
    return any(key == _STATUS_DETAILS_KEY for key, _ in metadata or ())


class DiagnosedRpcError(grpc.RpcError, grpc.Call, grpc.Future):  # type: ignore[misc]
    """A failed call explained: the original's code, a message that names the fix,
    and trailers carrying the ErrorInfo (so `to_error` and `rpc_status` read the
    reason). Also a finished `grpc.Call`/`grpc.Future`, as interceptors return."""

    def __init__(self, original: grpc.RpcError, diagnosis: Diagnosis) -> None:
        super().__init__()
        self.original = original
        self.reason = diagnosis.reason
        self._code = _code(original) or grpc.StatusCode.UNAVAILABLE
        original_details = getattr(original, "details", None)
        said = (original_details() if callable(original_details) else None) or ""
        self._details = diagnosis.details(said)
        self._trailers = (
            (_STATUS_DETAILS_KEY, status_details(self._code, self._details, diagnosis)),
        )

    def __str__(self) -> str:
        return f"{self._code.name}: {self._details}"

    # grpc.Call
    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return self._trailers

    def initial_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return ()

    def debug_error_string(self) -> str:
        debug = getattr(self.original, "debug_error_string", None)
        return str(debug()) if callable(debug) else self._details

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    # grpc.Future: finished, with this error
    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        raise self

    def exception(self, timeout: float | None = None) -> DiagnosedRpcError:
        return self

    def traceback(self, timeout: float | None = None) -> None:
        return None

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)


def aio_explained(exc: grpc.RpcError, address: str, tls: TLSConfig | None) -> grpc.RpcError:
    """As `explained`, as a grpc.aio.AioRpcError (for asyncio clients; blocks: run it
    in a thread)."""
    diagnosis = diagnose(exc, address, tls)
    if diagnosis is None:
        return exc
    diagnosed = DiagnosedRpcError(exc, diagnosis)
    return grpc.aio.AioRpcError(
        diagnosed.code(),
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*diagnosed.trailing_metadata()),
        diagnosed.details(),
        diagnosed.debug_error_string(),
    )


# --- the channel interceptor ----------------------------------------------------------------


class ExplainingInterceptor(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Explains the unary calls of a grpcio channel that fail UNAVAILABLE (after the
    channel's retries): blocking calls, ``with_call`` and ``future``."""

    def __init__(self, address: str, tls: TLSConfig | None) -> None:
        self._address, self._tls = address, tls

    def _explain(self, exc: grpc.RpcError) -> grpc.RpcError:
        return explained(exc, self._address, self._tls)

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        outcome = continuation(client_call_details, request)
        if not outcome.done():
            return _ExplainedFuture(outcome, self._explain)
        failure = outcome.exception()
        if isinstance(failure, grpc.RpcError):
            return self._explain(failure)
        return outcome


class _ExplainedFuture(grpc.Call, grpc.Future):  # type: ignore[misc]
    """A call in flight (``future``) whose failure, once it comes, is explained
    (once, by whichever thread asks first)."""

    def __init__(self, inner: Any, explain: Callable[[grpc.RpcError], grpc.RpcError]) -> None:
        self._inner, self._explain = inner, explain
        self._lock = threading.Lock()
        self._failure: grpc.RpcError | None = None
        self._settled = False

    def _outcome(self, timeout: float | None) -> grpc.RpcError | None:
        """The (explained) failure once the call ended; None when it succeeded."""
        failure = self._inner.exception(timeout)  # waits; FutureTimeoutError past timeout
        with self._lock:
            if not self._settled:
                if isinstance(failure, grpc.RpcError):
                    self._failure = self._explain(failure)
                self._settled = True
            return self._failure

    def result(self, timeout: float | None = None) -> Any:
        failure = self._outcome(timeout)
        if failure is not None:
            raise failure
        return self._inner.result(timeout)

    def exception(self, timeout: float | None = None) -> Any:
        return self._outcome(timeout)

    def traceback(self, timeout: float | None = None) -> Any:
        return self._inner.traceback(timeout)

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self._inner.add_done_callback(lambda _: fn(self))

    def cancel(self) -> bool:
        return bool(self._inner.cancel())

    def cancelled(self) -> bool:
        return bool(self._inner.cancelled())

    def running(self) -> bool:
        return bool(self._inner.running())

    def done(self) -> bool:
        return bool(self._inner.done())

    # As grpc's, these wait for the call to end.
    def code(self) -> Any:
        failure = self._outcome(None)
        return self._inner.code() if failure is None else failure.code()

    def details(self) -> Any:
        failure = self._outcome(None)
        return self._inner.details() if failure is None else failure.details()

    def trailing_metadata(self) -> Any:
        failure = self._outcome(None)
        return self._inner.trailing_metadata() if failure is None else failure.trailing_metadata()

    def initial_metadata(self) -> Any:
        return self._inner.initial_metadata()

    def is_active(self) -> bool:
        return bool(self._inner.is_active())

    def time_remaining(self) -> Any:
        return self._inner.time_remaining()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return bool(self._inner.add_callback(callback))


__all__ = [
    "CLIENT_CERT_REQUIRED",
    "PROBE_TIMEOUT",
    "TLS_NOT_SUPPORTED",
    "TLS_REQUIRED",
    "DiagnosedRpcError",
    "Diagnosis",
    "ExplainingInterceptor",
    "Finding",
    "aio_explained",
    "diagnose",
    "diagnose_address",
    "explained",
    "may_explain",
    "probe",
    "tcp_endpoint",
]
