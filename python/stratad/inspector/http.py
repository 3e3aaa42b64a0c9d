"""A small HTTP/1.1 server on asyncio streams, for the inspector's few pages and JSON reads.

Why not a framework: the inspector needs GET (and HEAD) on a handful of
routes, served from the daemon's own event loop. The standard library's
`asyncio.start_server` does that in a page of code, with limits a public
listener needs (request head size, read timeout, connections), and adds no
dependency to a daemon that must stay small. One request per connection
(``Connection: close``): pages make a few requests each, so keep-alive would
buy nothing worth its state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
#: Seconds a client gets to send its request head (slow clients cannot pin connections).
READ_TIMEOUT = 10.0
#: Seconds a client gets to take a response.
WRITE_TIMEOUT = 30.0
#: Connections served at once; more wait in the kernel's backlog.
MAX_CONNECTIONS = 64


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
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        #: HOST:PORT actually listened on (the real port when 0 was asked for).
        self.address = ""

    async def start(self, listen: str) -> str:
        host, _, port = listen.rpartition(":")
        bind_host = host.removeprefix("[").removesuffix("]")
        try:
            self._server = await asyncio.start_server(
                self._accept, bind_host, int(port), limit=MAX_HEAD_BYTES
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
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            async with self._slots:
                await self._serve_one(reader, writer)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the client went away or stalled: nothing to answer
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        method = "GET"
        try:
            head = await asyncio.wait_for(_read_head(reader), READ_TIMEOUT)
            request = parse_request(head, peer=_peer(writer))
            method = request.method
            response = await self._handler(request)
        except BadRequest as exc:
            response = Response(exc.status, exc.message.encode() + b"\n")
            if exc.status == HTTPStatus.METHOD_NOT_ALLOWED:
                response.headers["Allow"] = "GET, HEAD"
        except Exception:
            _log.exception("inspector: request failed")
            response = Response(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n")
        writer.write(self._encode(response, head_only=method == "HEAD"))
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)

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
