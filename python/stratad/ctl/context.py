"""What every ``stratad ctl`` command shares: `Ctl` (the daemon's connection and how
to print), the exit codes, the connection the flags name, and the formatting of
protobuf messages, times, sizes and tables for the text output."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from google.protobuf import json_format, timestamp_pb2

from stratad.api.v1 import common_pb2, session_pb2
from stratad.ctl.progress import Progress
from stratad.errors import StratadError
from stratad.sdk.client import Client
from stratad.sdk.connection import Connection, TLSConfig

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PROBLEMS = 3
EXIT_INTERRUPTED = 130

STATUS_NAMES = {
    value: name.removeprefix("SESSION_STATUS_").lower()
    for name, value in common_pb2.SessionStatus.items()
}


class CtlError(StratadError):
    """A failure of the command itself (bad archive path, inconsistent import)."""


@dataclass
class Ctl:
    """What every command gets: where the daemon is, how to print."""

    connection: Connection
    timeout: float
    json: bool
    progress_mode: str
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    _client: Client | None = None

    @property
    def address(self) -> str:
        return self.connection.address

    @property
    def tenant(self) -> str:
        return self.connection.tenant

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client.from_connection(self.connection, timeout=self.timeout)
        return self._client

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Tenant header and bearer token, for calls made on the client's channel."""
        return self.connection.metadata

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def progress(self, label: str, total: int | None = None) -> Progress:
        enabled = {"always": True, "never": False}.get(self.progress_mode)
        return Progress(label, total, enabled=enabled, stream=self.err)

    def emit(self, document: Any, text: str | Callable[[], str]) -> None:
        """Print ``document`` as JSON with --json, else ``text``."""
        if self.json:
            self.out.write(json.dumps(document, indent=2) + "\n")
        else:
            body = text() if callable(text) else text
            if body:
                self.out.write(body if body.endswith("\n") else body + "\n")
        self.out.flush()

    def note(self, message: str) -> None:
        """A remark for the operator on stderr (never mixed into --json output)."""
        self.err.write(f"stratad ctl: {message}\n")
        self.err.flush()


def connection_of(args: argparse.Namespace) -> Connection:
    """The daemon and credentials the flags name; the environment fills in the rest."""
    tls_files = (args.tls_ca, args.tls_cert, args.tls_key)
    tls: TLSConfig | bool | None = args.tls
    if any(tls_files) or args.tls_server_name:
        # Flags complete what the environment says (a CA in env, a client cert by flag).
        base = TLSConfig.from_env(os.environ) or TLSConfig()
        tls = TLSConfig(
            args.tls_ca or base.ca_file,
            args.tls_cert or base.cert_file,
            args.tls_key or base.key_file,
            args.tls_server_name or base.server_name,
        )
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    return Connection.resolve(args.address, tenant=args.tenant, token=token, tls=tls)


# --- formatting helpers ----------------------------------------------------------------


def to_dict(message: Any) -> dict[str, Any]:
    result: dict[str, Any] = json_format.MessageToDict(
        message,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=True,
        unquote_int64_if_possible=True,
    )
    return result


def session_dict(session: session_pb2.Session) -> dict[str, Any]:
    d = to_dict(session)
    d["status"] = STATUS_NAMES.get(session.status, str(session.status))
    return d


def when(ts: timestamp_pb2.Timestamp) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts.seconds))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "EXIT_USAGE",
    "STATUS_NAMES",
    "Ctl",
    "CtlError",
    "connection_of",
    "human_bytes",
    "session_dict",
    "table",
    "to_dict",
    "when",
]
