"""A small HTTP/1.1 server on asyncio streams, for the inspector's few pages and JSON reads.

Why not a framework: the inspector needs GET (and HEAD) on a handful of
routes, served from the daemon's own event loop. The standard library's
`asyncio.start_server` does that in a page of code, with limits a public
listener needs, and adds no dependency to a daemon that must stay small.

Idle and slow clients cannot starve it: every connection gets its own task
(none waits for another's slot), must send its whole request head within
`HEAD_TIMEOUT` or is closed, and at most `MAX_CONNECTIONS` are open at once;
one beyond that is answered 503 and closed at once, so descriptors and tasks
stay bounded. One request per connection (``Connection: close``): pages make a
few requests each, so keep-alive would buy nothing worth its state, and no
connection idles after its answer. A client that stalls or goes away is a
DEBUG line, never an ERROR: it is the client's doing, not the daemon's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus

from stratad.errors import UnavailableError

_log = logging.getLogger(__name__)

#: Largest request line plus headers; a browser's GET is well under 2 KiB.
MAX_HEAD_BYTES = 16 << 10
MAX_HEADERS = 64
MAX_QUERY_FIELDS = 16
#: Seconds from accepting a connection to the end of its request head. A browser
#: sends its GET as soon as it connects (well under a second, even through
#: ``kubectl port-forward`` or an SSH tunnel); a socket that sends nothing, or
#: dribbles its head (slowloris), gives its slot back after this.
HEAD_TIMEOUT = 5.0
#: Seconds a client gets to take its whole answer (a few MiB at most: states are
#: decoded up to 8 MiB): generous for a slow tunnel, while a client that stops
#: reading is dropped rather than holding its connection for good.
WRITE_TIMEOUT = 30.0
#: Connections open at once. A browser opens at most 6 to a host, so this leaves
#: room for hundreds of stray or idle sockets (each gone after HEAD_TIMEOUT)
#: without locking a person out, while bounding what they cost: each one
#: descriptor and a task, and until its head is read a buffer of at most
#: 2 x MAX_HEAD_BYTES (512 x 32 KiB = 16 MiB). One beyond it is answered 503 and
#: closed without being read.
MAX_CONNECTIONS = 512
#: Seconds between two WARNINGs that connections are being refused (a flood
#: would otherwise write one line per refused connection).
REFUSED_WARNING_INTERVAL = 60.0


class HttpStartError(UnavailableError):
    """The inspector could not listen (address taken or invalid)."""


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    #: The path as sent (percent-encoded), without the query.
    path: str
    #: The path split on "/" and then percent-decoded, so an encoded "/" stays
    #: inside its segment; no empty trailing segment.
    segments: tuple[str, ...]
    #: The first value of each query parameter.
    query: Mapping[str, str]
    #: Header names in lower case.
    headers: Mapping[str, str]
    #: The client's address, for the audit log.
    peer: str = ""


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response]]


class BadRequest(Exception):
    """The request cannot be parsed; answered with ``status`` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class HttpServer:
    """Serve ``handler`` on one TCP address; every response gets ``default_headers``."""

    def __init__(self, handler: Handler, default_headers: Mapping[str, str] | None = None) -> None:
        self._handler = handler
        self._default_headers = dict(default_headers or {})
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        #: Connections refused at the cap since the last WARNING, and when it was.
        self._refused = 0
        self._refused_warned_at = -REFUSED_WARNING_INTERVAL
        #: HOST:PORT actually listened on (the real port when 0 was asked for).
        self.address = ""

    async def start(self, listen: str) -> str:
        host, _, port = listen.rpartition(":")
        bind_host = host.removeprefix("[").removesuffix("]")
        try:
            # A backlog of MAX_CONNECTIONS (asyncio's default is 100): a burst of
            # connections while the event loop is busy waits in the kernel's
            # accept queue instead of having its handshakes dropped and retried
            # seconds later (which CI saw: 300 connections at once, accepted
            # late, closed long after HEAD_TIMEOUT).
            self._server = await asyncio.start_server(
                self._accept,
                bind_host,
                int(port),
                limit=MAX_HEAD_BYTES,
                backlog=MAX_CONNECTIONS,
            )
        except OSError as exc:
            raise HttpStartError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
        real_port = self._server.sockets[0].getsockname()[1]
        self.address = f"{host}:{real_port}"
        return self.address

    async def stop(self) -> None:
        """Stop listening and end the connections still open."""
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._connection(reader, writer)
        except asyncio.CancelledError:
            # The daemon is stopping. The connection's own task ends here, quietly:
            # asyncio before 3.12 logs a start_server task that ends cancelled as
            # an ERROR ("Exception in callback").
            writer.transport.abort()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= MAX_CONNECTIONS:
            self._refuse(writer)
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        # drain() then waits until the answer has all gone to the kernel, so a
        # client that stops reading is caught by WRITE_TIMEOUT, and close() below
        # never waits on a buffer such a client would never empty.
        writer.transport.set_write_buffer_limits(high=0)
        peer = _peer(writer)
        finished = False
        try:
            finished = await self._serve_one(reader, writer, peer)
        except TimeoutError:
            _log.debug("inspector: %s closed: answer not taken within %gs", peer, WRITE_TIMEOUT)
        except ConnectionError as exc:
            _log.debug("inspector: %s went away before its answer (%s)", peer, exc)
        finally:
            self._connections.discard(task)
            if finished:
                writer.close()
            else:
                writer.transport.abort()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _refuse(self, writer: asyncio.StreamWriter) -> None:
        """Answer 503 and close, without reading the request: the cap is reached."""
        response = Response(
            HTTPStatus.SERVICE_UNAVAILABLE,
            b"the inspector has too many connections open; try again shortly\n",
            headers={"Retry-After": str(int(HEAD_TIMEOUT))},
        )
        writer.write(self._encode(response, head_only=False))
        writer.close()  # a few hundred bytes: the kernel takes them at once
        self._refused += 1
        _log.debug("inspector: refused %s: %d connections open", _peer(writer), MAX_CONNECTIONS)
        now = time.monotonic()
        if now - self._refused_warned_at >= REFUSED_WARNING_INTERVAL:
            _log.warning(
                "inspector: %d connections open, its limit: refusing new ones with 503 "
                "(%d refused since this was last logged); idle ones are closed after %gs",
                MAX_CONNECTIONS,
                self._refused,
                HEAD_TIMEOUT,
            )
            self._refused, self._refused_warned_at = 0, now

    async def _serve_one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> bool:
        """Read one request and answer it; False when the client stalled or left first."""
        method = "GET"
        try:
            head = await asyncio.wait_for(_read_head(reader), HEAD_TIMEOUT)
        except TimeoutError:
            _log.debug("inspector: %s closed: no request head within %gs", peer, HEAD_TIMEOUT)
            return False
        except (ConnectionError, asyncio.IncompleteReadError):
            _log.debug("inspector: %s went away before sending a request", peer)
            return False
        except BadRequest as exc:
            response = _bad_request(exc)
        else:
            try:
                request = parse_request(head, peer=peer)
                method = request.method
                response = await self._handler(request)
            except BadRequest as exc:
                response = _bad_request(exc)
            except Exception:
                _log.exception("inspector: request failed")
                response = Response(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n")
        writer.write(self._encode(response, head_only=method == "HEAD"))
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
        return True

    def _encode(self, response: Response, *, head_only: bool) -> bytes:
        reason = HTTPStatus(response.status).phrase
        headers = {
            **self._default_headers,
            "Content-Type": response.content_type,
            "Content-Length": str(len(response.body)),
            "Connection": "close",
            **response.headers,
        }
        lines = [f"HTTP/1.1 {response.status} {reason}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if head_only else head + response.body


def _bad_request(exc: BadRequest) -> Response:
    response = Response(exc.status, exc.message.encode() + b"\n")
    if exc.status == HTTPStatus.METHOD_NOT_ALLOWED:
        response.headers["Allow"] = "GET, HEAD"
    return response


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise BadRequest(
            HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large"
        ) from None


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else ""


def parse_request(head: bytes, peer: str = "") -> Request:
    """Parse a request head (request line and headers, ending in an empty line)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise BadRequest(HTTPStatus.BAD_REQUEST, "malformed request") from None
    request_line, *header_lines = text.split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(HTTPStatus.BAD_REQUEST, "malformed request line")
    method, target, _ = parts
    if method not in ("GET", "HEAD"):
        raise BadRequest(HTTPStatus.METHOD_NOT_ALLOWED, "the inspector is read-only: GET only")
    if not target.startswith("/"):
        raise BadRequest(HTTPStatus.BAD_REQUEST, "expected a path starting with /")
    headers = _parse_headers(header_lines)
    split = urllib.parse.urlsplit(target)
    return Request(method, split.path, _segments(split.path), _query(split.query), headers, peer)


def _parse_headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(HTTPStatus.BAD_REQUEST, "malformed header line")
        headers[name.lower()] = value.strip()
        if len(headers) > MAX_HEADERS:
            raise BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too many headers")
    return headers


def _segments(path: str) -> tuple[str, ...]:
    raw = path.split("/")[1:]
    if raw and raw[-1] == "":
        raw.pop()
    try:
        return tuple(urllib.parse.unquote(s, errors="strict") for s in raw)
    except UnicodeDecodeError:
        raise BadRequest(HTTPStatus.BAD_REQUEST, "the path is not UTF-8") from None


def _query(query: str) -> dict[str, str]:
    try:
        pairs = urllib.parse.parse_qsl(
            query, keep_blank_values=True, max_num_fields=MAX_QUERY_FIELDS, errors="strict"
        )
    except (ValueError, UnicodeDecodeError):
        raise BadRequest(HTTPStatus.BAD_REQUEST, "malformed query string") from None
    values: dict[str, str] = {}
    for name, value in pairs:
        values.setdefault(name, value)
    return values


__all__ = ["BadRequest", "Handler", "HttpServer", "HttpStartError", "Request", "Response"]
