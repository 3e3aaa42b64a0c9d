"""A gRPC call over raw HTTP/2 (the `h2` library), for what grpcio cannot send:
unknown encodings, malformed metadata and timeouts, a request body that never
arrives. One call per connection, synchronous, bounded by a timeout."""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events


@dataclass
class RawAnswer:
    """What came back: headers, trailers (Trailers-Only: both in ``headers``), body."""

    headers: dict[str, str] = field(default_factory=dict)
    trailers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    ended: bool = False
    seconds: float = 0.0

    @property
    def status(self) -> int | None:
        """grpc-status, wherever it came (trailers, or the headers of Trailers-Only)."""
        value = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if value is None else int(value)

    @property
    def message(self) -> str:
        return self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))


def frame(message: bytes, compressed: bool = False) -> bytes:
    """One gRPC length-prefixed message."""
    return struct.pack(">BI", int(compressed), len(message)) + message


def connect(target: str) -> socket.socket:
    if target.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(target.removeprefix("unix:"))
        return sock
    host, _, port = target.rpartition(":")
    return socket.create_connection((host, int(port)))


def call(
    target: str,
    path: str,
    *,
    headers: list[tuple[bytes, bytes]] = (),  # type: ignore[assignment]
    body: bytes | None = b"",
    end: bool = True,
    timeout: float = 10.0,
) -> RawAnswer:
    """POST ``body`` (already framed; None: no DATA at all) to ``path`` and read
    the answer until the stream ends or ``timeout`` passes. ``end=False``
    leaves the request open, as a client whose body never finishes."""
    sock = connect(target)
    sock.settimeout(0.2)
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    conn.initiate_connection()
    request = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.encode()),
        (b":authority", b"localhost"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        *headers,
    ]
    stream = conn.get_next_available_stream_id()
    conn.send_headers(stream, request, end_stream=body is None and end)
    if body is not None:
        conn.send_data(stream, body, end_stream=end)
    sock.sendall(conn.data_to_send())
    answer = RawAnswer()
    started = time.monotonic()
    try:
        while not answer.ended and time.monotonic() - started < timeout:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                break
            for event in conn.receive_data(data):
                _record(event, answer, conn)
            sock.sendall(conn.data_to_send())
    finally:
        answer.seconds = time.monotonic() - started
        sock.close()
    return answer


def _record(event: object, answer: RawAnswer, conn: h2.connection.H2Connection) -> None:
    def text(pairs: list[tuple[bytes, bytes]]) -> dict[str, str]:
        return {k.decode(): v.decode("latin-1") for k, v in pairs}

    if isinstance(event, h2.events.ResponseReceived):
        answer.headers = text(event.headers)
    elif isinstance(event, h2.events.TrailersReceived):
        answer.trailers = text(event.headers)
    elif isinstance(event, h2.events.DataReceived):
        answer.body += event.data
        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
    elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
        answer.ended = True
