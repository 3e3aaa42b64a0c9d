"""Helpers of tests/edge: `Daemon` (a daemon subprocess) and `TcpRelay`."""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

#: A cold build (empty Go caches) of the Go tools the tests use takes minutes.
BUILD_TIMEOUT = 1500


@dataclass
class Daemon:
    """A ``stratad serve`` subprocess; its stdout and stderr go to ``log_path``."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def serving_line(self) -> str:
        """The daemon's "serving on ... (front ...)" log line."""
        return next((line for line in self.output().splitlines() if " serving on " in line), "")


class TcpRelay:
    """Accepts TCP connections on 127.0.0.1 and relays each to ``target``.

    ``target`` is a unix socket path (str) or a (host, port) pair. Bytes pass
    unchanged in both directions; an orderly close (EOF) of one side is passed
    on as a half-close (shutdown of writing) of the other, and a reset (an
    ECONNRESET from either side) as a reset (close with SO_LINGER 0), so that
    whoever is at the TCP end sees the connection end the way the server
    ended it. One thread per connection; stop() stops accepting.

    Checked against a daemon with ``front = python``: h2spec fails the same
    cases on its TCP port directly, through this relay to that port, and
    through this relay to its unix socket (but for the races test_h2spec.py
    describes).
    """

    def __init__(self, target: str | tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = int(self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _connect(self) -> socket.socket:
        if isinstance(self._target, str):
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self._target)
            return upstream
        return socket.create_connection(self._target)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = self._connect()
            except OSError:
                _reset(client)
                continue
            threading.Thread(target=_relay, args=(client, upstream), daemon=True).start()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a reset (RST on TCP) rather than an orderly FIN."""
    with contextlib.suppress(OSError):
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _relay(a: socket.socket, b: socket.socket) -> None:
    peer = {a: b, b: a}
    reading = {a, b}
    # Sockets whose peer reset the connection: a write to them failed. What
    # they still hold for us (a GOAWAY the server sent before its reset) is
    # passed on before the reset is; what comes for them is dropped, as the
    # peer's kernel would have dropped it.
    broken: set[socket.socket] = set()
    with selectors.DefaultSelector() as selector:
        for sock in reading:
            selector.register(sock, selectors.EVENT_READ)
        try:
            while reading:
                for key, _ in selector.select():
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = src.recv(65536)
                    dst = peer[src]
                    if data:
                        if dst not in broken:
                            try:
                                dst.sendall(data)
                            except OSError:
                                broken.add(dst)
                        continue
                    # EOF: pass on the half-close; the other direction goes on.
                    selector.unregister(src)
                    reading.discard(src)
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
        except OSError:
            # A reset (after the data that came before it): reset both ends.
            _reset(a)
            _reset(b)
            return
    a.close()
    b.close()
