"""The ``stratad ctl`` commands (see `stratad.ctl` for the list and exit codes)."""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc
from google.protobuf import json_format, timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stratad.api.v1 import admin_pb2, checkpoint_pb2, common_pb2, session_pb2
from stratad.ctl import decode
from stratad.ctl.archive import (
    ArchivedBlob,
    ArchivedCheckpoint,
    ArchivedSession,
    ArchivedWrite,
    ArchiveError,
    ArchiveReader,
    ArchiveWriter,
)
from stratad.ctl.progress import Progress
from stratad.errors import AlreadyExistsError, NotFoundError, StratadError, UnavailableError
from stratad.sdk.client import Client, to_error
from stratad.sdk.connection import Connection, TLSConfig
from stratad.server.auth import token_digest

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PROBLEMS = 3
EXIT_INTERRUPTED = 130
#: Verify and CollectGarbage walk the whole store: never give them less than this.
MAINTENANCE_TIMEOUT = 3600.0

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


def run(args: argparse.Namespace) -> int:
    if args.ctl_command == "token":  # offline: no daemon, no connection
        return run_token(args)
    if args.ctl_command == "completion":
        from stratad.ctl.completion import completion_script

        sys.stdout.write(completion_script(args.shell))
        return EXIT_OK
    try:
        connection = connection_of(args)
    except (OSError, ValueError) as exc:
        print(f"stratad ctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    ctl = Ctl(connection, timeout=args.timeout, json=args.json, progress_mode=args.progress)
    command = args.ctl_command
    sub = getattr(args, f"{command}_command", None)
    handler = COMMANDS[(command, sub) if sub else (command,)]
    try:
        return handler(ctl, args)
    except ArchiveError as exc:
        ctl.note(f"refusing the archive: {exc.message}")
        return EXIT_FAILED
    except UnavailableError as exc:
        ctl.note(f"cannot reach the daemon at {ctl.address}: {exc.message}")
        return EXIT_FAILED
    except StratadError as exc:
        ctl.note(exc.message or type(exc).__name__)
        return EXIT_FAILED
    except OSError as exc:
        ctl.note(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
        return EXIT_FAILED
    except KeyboardInterrupt:
        ctl.note("interrupted")
        return EXIT_INTERRUPTED
    finally:
        ctl.close()


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


# --- health ----------------------------------------------------------------------------


def cmd_health(ctl: Ctl, args: argparse.Namespace) -> int:
    status_names = health_pb2.HealthCheckResponse.ServingStatus
    try:
        response = health_pb2_grpc.HealthStub(ctl.client.channel).Check(
            health_pb2.HealthCheckRequest(service=args.service),
            timeout=min(ctl.timeout, 10.0),
            metadata=ctl.metadata,
        )
    except grpc.RpcError as exc:
        error = to_error(exc)
        ctl.emit({"status": "UNREACHABLE", "error": error.message}, "")
        ctl.note(f"{ctl.address}: {error.message}")
        return EXIT_FAILED
    name = status_names.Name(response.status)
    ctl.emit({"status": name}, name)
    return EXIT_OK if response.status == health_pb2.HealthCheckResponse.SERVING else EXIT_FAILED


# --- sessions -------------------------------------------------------------------------------


def cmd_sessions_ls(ctl: Ctl, args: argparse.Namespace) -> int:
    sessions = list(ctl.client.list_sessions(prefix=args.prefix, page_size=1000))
    rows = [
        [
            s.session_id,
            STATUS_NAMES.get(s.status, "?"),
            str(s.version),
            str(s.checkpoint_count),
            when(s.updated_at),
            ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())),
        ]
        for s in sessions
    ]
    ctl.emit(
        {"sessions": [session_dict(s) for s in sessions]},
        lambda: table(["SESSION", "STATUS", "VERSION", "CHECKPOINTS", "UPDATED", "LABELS"], rows),
    )
    return EXIT_OK


def cmd_sessions_show(ctl: Ctl, args: argparse.Namespace) -> int:
    s = ctl.client.get_session(args.session_id)

    def text() -> str:
        lines = [
            f"session:      {s.session_id}",
            f"status:       {STATUS_NAMES.get(s.status, '?')}",
            f"version:      {s.version}",
            f"checkpoints:  {s.checkpoint_count}",
            f"head:         {s.head_checkpoint_id or '-'}",
            f"created:      {when(s.created_at)}",
            f"updated:      {when(s.updated_at)}",
            f"retention:    keep_last={s.retention.keep_last or 'unlimited'} "
            f"max_age_seconds={s.retention.max_age_seconds or 'unlimited'}",
        ]
        if s.forked_from_checkpoint_id:
            lines.append(f"forked from:  {s.forked_from_checkpoint_id}")
        for key, value in sorted(s.labels.items()):
            lines.append(f"label:        {key}={value}")
        return "\n".join(lines)

    ctl.emit({"session": session_dict(s)}, text)
    return EXIT_OK


def cmd_sessions_rm(ctl: Ctl, args: argparse.Namespace) -> int:
    deleted = []
    for session_id in args.session_ids:
        ctl.client.delete_session(session_id)
        deleted.append(session_id)
        if not ctl.json:
            ctl.out.write(f"deleted {session_id}\n")
    if ctl.json:
        ctl.emit({"deleted": deleted}, "")
    return EXIT_OK


# --- checkpoints and state ----------------------------------------------------------------


def cmd_checkpoints_ls(ctl: Ctl, args: argparse.Namespace) -> int:
    checkpoints = []
    for cp in ctl.client.list_checkpoints(args.session_id, namespace=args.namespace):
        checkpoints.append(cp)
        if args.limit and len(checkpoints) >= args.limit:
            break
    rows = [
        [
            c.checkpoint_id,
            when(c.created_at),
            c.namespace or "-",
            c.name or "-",
            human_bytes(c.size),
            human_bytes(c.stored_bytes),
            c.digest[:12],
            c.parent_checkpoint_id or "-",
        ]
        for c in checkpoints
    ]
    headers = ["CHECKPOINT", "CREATED", "NAMESPACE", "NAME", "SIZE", "STORED", "DIGEST", "PARENT"]
    ctl.emit({"checkpoints": [to_dict(c) for c in checkpoints]}, lambda: table(headers, rows))
    return EXIT_OK


def cmd_state_get(ctl: Ctl, args: argparse.Namespace) -> int:
    loaded = ctl.client.load_state(args.session_id, args.checkpoint, args.namespace)
    info = {
        "session_id": args.session_id,
        "checkpoint_id": loaded.checkpoint_id,
        "content_type": loaded.content_type,
        "digest": loaded.digest,
        "size": len(loaded.data),
        "metadata": json_format.MessageToDict(loaded.metadata),
    }
    if args.decode == "langgraph":
        info["state"] = decode.decode_langgraph(loaded.data, loaded.content_type)
        document = info if ctl.json else info["state"]
        text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
        if args.output == "-":
            ctl.out.write(text)
            ctl.out.flush()
        else:
            write_atomically(Path(args.output), text.encode())
        return EXIT_OK
    if args.output == "-":
        if ctl.json:
            info["data_base64"] = base64.b64encode(loaded.data).decode()
            ctl.emit(info, "")
        else:
            sys.stdout.buffer.write(loaded.data)
            sys.stdout.buffer.flush()
        return EXIT_OK
    path = Path(args.output)
    write_atomically(path, loaded.data)
    info["path"] = str(path)
    ctl.emit(
        info,
        f"wrote {len(loaded.data)} bytes of checkpoint {loaded.checkpoint_id} to {path}",
    )
    return EXIT_OK


def write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def cmd_checkpoints_show(ctl: Ctl, args: argparse.Namespace) -> int:
    loaded = ctl.client.load_state_with_writes(args.session_id, args.checkpoint_id)
    cp = loaded.checkpoint
    decoded = decode.decode(loaded.data, cp.content_type or loaded.content_type, args.decode)
    ancestors = _ancestors(ctl, args.session_id, cp.parent_checkpoint_id)
    checkpoint = to_dict(cp)
    checkpoint.pop("pending_writes", None)  # listed below, without their values
    writes = [
        {
            "task_id": w.task_id,
            "task_path": w.task_path,
            "idx": w.idx,
            "channel": w.channel,
            "type": w.type,
            "size": len(w.value),
        }
        for w in cp.pending_writes
    ]
    document = {
        "checkpoint": checkpoint,
        "ancestors": ancestors,
        "pending_writes": writes,
        "state": _state_document(decoded),
    }

    def text() -> str:
        lines = [
            f"checkpoint:   {cp.checkpoint_id}",
            f"session:      {args.session_id}",
            f"created:      {when(cp.created_at)}",
            f"version:      {cp.version}",
            f"namespace:    {cp.namespace or '-'}",
            f"name:         {cp.name or '-'}",
            f"content type: {cp.content_type or '-'}",
            f"size:         {cp.size} ({human_bytes(cp.size)}), "
            f"stored {human_bytes(cp.stored_bytes)}",
            f"digest:       {cp.digest}",
            f"parent:       {cp.parent_checkpoint_id or '-'}",
        ]
        if len(ancestors) > 1:
            lines.append(f"ancestors:    {' <- '.join(ancestors)}")
        lines.append(f"pending writes: {cp.pending_write_count}")
        for w in writes:
            lines.append(f"  {w['task_id']} #{w['idx']} {w['channel']} ({w['size']} bytes)")
        metadata = json_format.MessageToDict(cp.metadata)
        lines.append("metadata:     " + (json.dumps(metadata, sort_keys=True) if metadata else "-"))
        lines.append(f"state ({decoded.kind}):")
        lines.append(_state_text(decoded))
        return "\n".join(lines)

    ctl.emit(document, text)
    return EXIT_OK


def _ancestors(ctl: Ctl, session_id: str, parent: str) -> list[str]:
    """The chain of parents, nearest first, as far as the session still holds them."""
    if not parent:
        return []
    parents = {
        c.checkpoint_id: c.parent_checkpoint_id for c in ctl.client.list_checkpoints(session_id)
    }
    chain = []
    while parent and parent not in chain:
        chain.append(parent)
        parent = parents.get(parent, "")
    return chain


def _state_document(decoded: decode.Decoded) -> dict[str, Any]:
    if decoded.kind == "bytes":
        data: bytes = decoded.value
        return {"kind": "bytes", "size": len(data), "base64": base64.b64encode(data).decode()}
    return {"kind": decoded.kind, "value": decoded.value}


#: Bytes of a non-JSON state `checkpoints show` prints (as a hex dump) without --json.
SHOW_BYTES = 256


def _state_text(decoded: decode.Decoded) -> str:
    if decoded.kind != "bytes":
        return json.dumps(decoded.value, indent=2, ensure_ascii=False)
    data: bytes = decoded.value
    lines = [
        f"  {offset:08x}  {data[offset : offset + 16].hex(' ')}"
        for offset in range(0, min(len(data), SHOW_BYTES), 16)
    ]
    if len(data) > SHOW_BYTES:
        lines.append(f"  ... {len(data) - SHOW_BYTES} more bytes (state get writes them all)")
    return "\n".join(lines) or "  (empty)"


def cmd_checkpoints_diff(ctl: Ctl, args: argparse.Namespace) -> int:
    a = ctl.client.load_state(args.session_id, args.checkpoint_a)
    b = ctl.client.load_state(args.session_id, args.checkpoint_b)
    decoded_a = decode.decode(a.data, a.content_type, args.decode)
    decoded_b = decode.decode(b.data, b.content_type, args.decode)
    header = {"session_id": args.session_id, "a": a.checkpoint_id, "b": b.checkpoint_id}
    if decoded_a.kind == "bytes" or decoded_b.kind == "bytes":
        summary = decode.byte_diff(a.data, b.data)
        ctl.emit({**header, "kind": "bytes", **summary}, lambda: _byte_diff_text(summary))
        return EXIT_OK
    changes = decode.diff(decoded_a.value, decoded_b.value)
    counts = {
        op: sum(1 for c in changes if c["op"] == op) for op in ("added", "removed", "changed")
    }
    ctl.emit(
        {**header, "kind": decoded_a.kind, "identical": not changes, **counts, "changes": changes},
        lambda: _diff_text(changes),
    )
    return EXIT_OK


def _diff_text(changes: list[dict[str, Any]]) -> str:
    if not changes:
        return "identical"
    sign = {"added": "+", "removed": "-", "changed": "~"}
    lines = []
    for change in changes:
        path = change["path"] or "/"
        if change["op"] == "changed":
            detail = f"{_short(change['before'])} -> {_short(change['after'])}"
        else:
            detail = _short(change.get("after", change.get("before")))
        lines.append(f"{sign[change['op']]} {path}: {detail}")
    return "\n".join(lines)


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _byte_diff_text(summary: dict[str, Any]) -> str:
    if summary["identical"]:
        return f"identical ({summary['size_a']} bytes)"
    return "\n".join(
        [
            f"not JSON: compared as bytes; {summary['size_a']} -> {summary['size_b']} bytes",
            f"first difference at byte {summary['first_difference_at']}; common prefix "
            f"{summary['common_prefix_bytes']} bytes, common suffix "
            f"{summary['common_suffix_bytes']} bytes",
            f"chunks shared: {summary['chunks_shared']} of {summary['chunks_a']} / "
            f"{summary['chunks_b']} ({human_bytes(summary['bytes_shared'])})",
        ]
    )


#: Waits between attempts to watch again while the daemon is unreachable.
WATCH_RECONNECT_FIRST = 0.2
WATCH_RECONNECT_MAX = 5.0


def cmd_sessions_watch(ctl: Ctl, args: argparse.Namespace) -> int:
    """Print events until the session is deleted or Ctrl-C. A daemon that goes
    away (killed, restarted, stopping) is watched again, with backoff, from the
    last version printed: no event is lost or printed twice."""
    if args.from_version < 0:
        raise CtlError("--from-version must not be negative")
    # Without --from-version, "only new events" is made a version first, so
    # that watching again after an outage resumes from a known point.
    last = args.from_version or ctl.client.get_session(args.session_id).version
    delay = WATCH_RECONNECT_FIRST
    while True:
        try:
            for event in _watch_events(ctl, args.session_id, last):
                _print_event(ctl, event)
                last, delay = event.version, WATCH_RECONNECT_FIRST
            # The stream ended: the session was deleted, or the daemon is stopping.
            ctl.client.get_session(args.session_id)
        except NotFoundError:
            ctl.note(f"the watch of {args.session_id} ended: the session was deleted")
            return EXIT_OK
        except UnavailableError as exc:
            ctl.note(
                f"the daemon is unreachable ({exc.message}); watching {args.session_id} "
                f"again from version {last} in {delay:g}s"
            )
            time.sleep(delay)
            delay = min(2 * delay, WATCH_RECONNECT_MAX)


def _watch_events(ctl: Ctl, session_id: str, after: int) -> Iterator[session_pb2.SessionEvent]:
    # No deadline: a watch lasts as long as the operator wants it to.
    events = ctl.client.watch_session(session_id, after, timeout=None)
    with contextlib.closing(events):  # type: ignore[type-var]  # a generator: close() cancels
        yield from events


def _print_event(ctl: Ctl, event: session_pb2.SessionEvent) -> None:
    if ctl.json:
        document = to_dict(event)
        document["status"] = STATUS_NAMES.get(event.status, str(event.status))
        ctl.out.write(json.dumps(document) + "\n")
    else:
        ctl.out.write(_event_text(event) + "\n")
    ctl.out.flush()


def _event_text(event: session_pb2.SessionEvent) -> str:
    parts = [when(event.at), f"v{event.version}", event.kind]
    if event.checkpoint_id:
        parts.append(event.checkpoint_id)
    if event.status:
        parts.append(STATUS_NAMES.get(event.status, str(event.status)))
    return "  ".join(parts)


# --- maintenance ------------------------------------------------------------------------------


def _long_call(ctl: Ctl, label: str, method: Any, request: Any) -> Any:
    """A unary call that may take minutes, with a spinner while it runs."""
    timeout = max(ctl.timeout, MAINTENANCE_TIMEOUT)
    future = method.future(request, timeout=timeout, metadata=ctl.metadata)
    with ctl.progress(label) as progress:
        while True:
            try:
                return future.result(timeout=0.1)
            except grpc.FutureTimeoutError:
                progress.update()
            except grpc.RpcError as exc:
                raise to_error(exc) from None


def cmd_verify(ctl: Ctl, args: argparse.Namespace) -> int:
    report: admin_pb2.VerifyResponse = _long_call(
        ctl, "verify", ctl.client.admin.Verify, admin_pb2.VerifyRequest()
    )

    def text() -> str:
        lines = [f"objects checked: {report.objects_checked}"]
        for c in report.corrupt_objects:
            sessions = ", ".join(c.session_ids) or "no session"
            lines.append(f"CORRUPT {c.digest}: {c.problem} (affects {sessions})")
        for s in report.damaged_sessions:
            lines.append(f"DAMAGED session {s}")
        if report.remote_objects_checked or report.remote_damaged_sessions:
            lines.append(f"objects checked in object storage: {report.remote_objects_checked}")
        for c in report.remote_corrupt_objects:
            lines.append(f"CORRUPT in object storage {c.digest}: {c.problem}")
        for s in report.remote_damaged_sessions:
            lines.append(f"DAMAGED in object storage: session {s}")
        for s in report.remote_damaged_library_segments:
            lines.append(f"DAMAGED in object storage: library segment {s}")
        lines.append("ok" if report.ok else "PROBLEMS FOUND")
        return "\n".join(lines)

    ctl.emit(to_dict(report), text)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def cmd_gc(ctl: Ctl, args: argparse.Namespace) -> int:
    report: admin_pb2.CollectGarbageResponse = _long_call(
        ctl, "gc", ctl.client.admin.CollectGarbage, admin_pb2.CollectGarbageRequest()
    )
    ctl.emit(
        to_dict(report),
        f"removed {report.objects_removed} objects ({human_bytes(report.bytes_freed)}), "
        f"kept {report.objects_kept}, in {report.seconds:.2f}s"
        + (
            f"; object storage: deleted {report.remote_packs_deleted} packs "
            f"({human_bytes(report.remote_bytes_freed)}), condemned "
            f"{report.remote_packs_condemned}"
            if report.remote_packs_deleted or report.remote_packs_condemned
            else ""
        ),
    )
    return EXIT_OK


def cmd_stats(ctl: Ctl, args: argparse.Namespace) -> int:
    s = ctl.client.store_stats()
    text = "\n".join(
        [
            f"sessions:          {s.sessions}",
            f"checkpoints:       {s.checkpoints}",
            f"objects:           {s.objects}",
            f"logical bytes:     {s.logical_bytes} ({human_bytes(s.logical_bytes)})",
            f"unique bytes:      {s.unique_bytes} ({human_bytes(s.unique_bytes)})",
            f"stored bytes:      {s.stored_bytes} ({human_bytes(s.stored_bytes)})",
            f"dedup ratio:       {s.dedup_ratio:.2f}",
            f"compression ratio: {s.compression_ratio:.2f}",
        ]
    )
    ctl.emit(to_dict(s), text)
    return EXIT_OK


def cmd_replication_status(ctl: Ctl, args: argparse.Namespace) -> int:
    s: admin_pb2.GetReplicationStatusResponse = ctl.client.call(
        ctl.client.admin.GetReplicationStatus, admin_pb2.GetReplicationStatusRequest()
    )
    text = "\n".join(
        [
            f"mode:            {s.mode}",
            f"node id:         {s.node_id}",
            f"sessions owned:  {s.sessions_owned}",
            f"bytes behind:    {s.bytes_behind} ({human_bytes(s.bytes_behind)})",
            f"objects queued:  {s.objects_queued}",
            f"lag:             {s.lag_seconds:.3f}s",
            f"last shipment:   {s.last_shipment_seconds:.3f}s",
            f"library behind:  {s.library_records_behind} records "
            f"(lag {s.library_lag_seconds:.3f}s)",
            f"library streams: {s.library_segments} segments, "
            f"{s.library_damaged_segments} damaged segments seen",
        ]
    )
    ctl.emit(to_dict(s), text)
    return EXIT_OK


def cmd_restore(ctl: Ctl, args: argparse.Namespace) -> int:
    request = admin_pb2.RestoreSessionFromRemoteRequest(session_id=args.session_id)
    restored: admin_pb2.RestoreSessionFromRemoteResponse = _long_call(
        ctl, f"restore {args.session_id}", ctl.client.admin.RestoreSessionFromRemote, request
    )
    session = restored.session
    ctl.emit(
        to_dict(restored),
        f"restored {session.session_id} from object storage: version {session.version}, "
        f"{session.checkpoint_count} checkpoints",
    )
    return EXIT_OK


# --- export ----------------------------------------------------------------------------------


def cmd_export(ctl: Ctl, args: argparse.Namespace) -> int:
    client = ctl.client
    session = client.get_session(args.session_id)
    newest_first = list(client.list_checkpoints(args.session_id, page_size=1000))
    checkpoints = list(reversed(newest_first))
    path = Path(args.output or f"{args.session_id}.stratad.tar")
    archived = ArchivedSession(
        session_id=session.session_id,
        status=STATUS_NAMES.get(session.status, ""),
        labels=dict(session.labels),
        keep_last=session.retention.keep_last,
        max_age_seconds=session.retention.max_age_seconds,
        head_checkpoint_id=session.head_checkpoint_id,
        forked_from_checkpoint_id=session.forked_from_checkpoint_id,
        created_at=session.created_at.ToJsonString() if session.created_at.seconds else "",
        version=session.version,
    )
    source = {"address": ctl.address, "tenant": ctl.tenant or "default"}
    logical = 0
    with (
        ArchiveWriter(path, archived, source) as writer,
        ctl.progress(f"export {args.session_id}", len(checkpoints)) as progress,
    ):
        for cp in checkpoints:
            try:
                loaded = _load_everything(client, args.session_id, cp.checkpoint_id)
            except NotFoundError:
                raise CtlError(
                    f"checkpoint {cp.checkpoint_id} disappeared during the export "
                    "(retention or a delete): export again, or pause the session first"
                ) from None
            archived_cp = _archived_checkpoint(cp)
            _add_extras(writer, archived_cp, loaded)
            writer.add_checkpoint(archived_cp, loaded.data)
            logical += len(loaded.data)
            progress.advance()
        archived.structured = _structured_blob(writer, _current_structured(client, args.session_id))
    after = client.get_session(args.session_id)
    if after.version != session.version:
        ctl.note(
            f"session {args.session_id} changed during the export (version {session.version} "
            f"-> {after.version}); the archive holds the checkpoints listed at the start"
        )
    size = path.stat().st_size
    summary = {
        "session_id": args.session_id,
        "path": str(path),
        "checkpoints": len(checkpoints),
        "chunks": len(writer.manifest.entries),
        "logical_bytes": logical,
        "archive_bytes": size,
    }
    ctl.emit(
        summary,
        f"exported {args.session_id}: {len(checkpoints)} checkpoints, "
        f"{human_bytes(logical)} of state in {human_bytes(size)} to {path}",
    )
    return EXIT_OK


def _load_everything(
    client: Client, session_id: str, checkpoint_id: str
) -> checkpoint_pb2.LoadStateResponse:
    """A checkpoint's state, pending writes and captured structured state in one call."""
    request = checkpoint_pb2.LoadStateRequest(
        session_id=session_id,
        checkpoint_id=checkpoint_id,
        include_writes=True,
        include_structured=True,
    )
    return client.call(client.checkpoints.LoadState, request)  # type: ignore[no-any-return]


def _add_extras(
    writer: ArchiveWriter, cp: ArchivedCheckpoint, loaded: checkpoint_pb2.LoadStateResponse
) -> None:
    """Store a checkpoint's pending writes and structured state as blobs of the archive."""
    cp.structured = _structured_blob(writer, loaded.structured_json)
    cp.pending_writes = [
        ArchivedWrite(
            task_id=w.task_id,
            task_path=w.task_path,
            idx=w.idx,
            channel=w.channel,
            type=w.type,
            value=writer.add_blob(w.value),
        )
        for w in loaded.checkpoint.pending_writes
    ]


def _structured_blob(writer: ArchiveWriter, structured_json: bytes) -> ArchivedBlob | None:
    """None for no structured state (a checkpoint that captured none, or ``{}``)."""
    if not structured_json or structured_json.strip() == b"{}":
        return None
    return writer.add_blob(structured_json)


def _current_structured(client: Client, session_id: str) -> bytes:
    request = session_pb2.GetStructuredStateRequest(session_id=session_id)
    response = client.call(client.sessions.GetStructuredState, request)
    return bytes(response.structured_json)


def _archived_checkpoint(cp: checkpoint_pb2.Checkpoint) -> ArchivedCheckpoint:
    return ArchivedCheckpoint(
        checkpoint_id=cp.checkpoint_id,
        parent_checkpoint_id=cp.parent_checkpoint_id,
        namespace=cp.namespace,
        name=cp.name,
        content_type=cp.content_type,
        metadata=json_format.MessageToDict(cp.metadata),
        created_at=cp.created_at.ToJsonString() if cp.created_at.seconds else "",
        version=cp.version,
        size=cp.size,
        digest=cp.digest,
        chunks=[],
    )


# --- import ----------------------------------------------------------------------------------


def cmd_import(ctl: Ctl, args: argparse.Namespace) -> int:
    path = Path(args.archive)
    if not path.is_file():
        raise CtlError(f"{path}: no such archive")
    with ArchiveReader(path, max_state_bytes=args.max_state_bytes) as reader:
        manifest = reader.manifest
        with ctl.progress(f"check {path.name}") as progress:
            reader.verify(lambda done, total: progress.update(done, total))
        if args.verify_only:
            ctl.emit(
                {"archive": str(path), "ok": True, "checkpoints": len(manifest.checkpoints)},
                f"{path}: ok ({len(manifest.checkpoints)} checkpoints of session "
                f"{manifest.session.session_id})",
            )
            return EXIT_OK
        session_id = args.session_id or manifest.session.session_id
        importer = _Importer(ctl, reader, session_id)
        importer.run()
    summary = {
        "session_id": session_id,
        "checkpoints": len(manifest.checkpoints),
        "status": importer.status,
        "notes": importer.notes,
    }
    ctl.emit(
        summary,
        f"imported {session_id}: {len(manifest.checkpoints)} checkpoints from {path}",
    )
    for note in importer.notes:
        ctl.note(note)
    return EXIT_OK


class _Importer:
    """Re-create a verified archive's session on the daemon, all or nothing."""

    def __init__(self, ctl: Ctl, reader: ArchiveReader, session_id: str) -> None:
        self.ctl = ctl
        self.client = ctl.client
        self.reader = reader
        self.manifest = reader.manifest
        self.session_id = session_id
        self.head = ""
        #: The archived checkpoint being imported (named when its ID is taken).
        self.current = ""
        self.imported: set[str] = set()
        self.notes: list[str] = []
        self.status = "active"
        self.has_structured = self.manifest.session.structured is not None or any(
            cp.structured is not None for cp in self.manifest.checkpoints
        )

    def run(self) -> None:
        s = self.manifest.session
        try:
            self.client.create_session(
                self.session_id,
                labels=s.labels,
                keep_last=s.keep_last,
                max_age_seconds=s.max_age_seconds,
            )
        except AlreadyExistsError as exc:
            if self._holds_archived(self.session_id):
                raise CtlError(
                    f"session {self.session_id!r} already exists in {self._tenant()} with the "
                    "archive's checkpoints, whose IDs are unique within a tenant (another "
                    "--session-id would not be enough): import into another --tenant, or "
                    f"delete session {self.session_id!r} first"
                ) from exc
            raise CtlError(
                f"session {self.session_id!r} already exists in {self._tenant()}: import under "
                "another --session-id, or into another --tenant"
            ) from exc
        try:
            self._checkpoints()
            self._finish()
        except BaseException as exc:
            with contextlib.suppress(StratadError):
                self.client.delete_session(self.session_id)
            if isinstance(exc, AlreadyExistsError) and self.current:
                raise CtlError(
                    f"import of {self.session_id} failed and was rolled back: "
                    f"{self._taken(self.current)}"
                ) from exc
            if isinstance(exc, StratadError) and not isinstance(exc, ArchiveError):
                raise CtlError(
                    f"import of {self.session_id} failed and was rolled back: {exc.message}"
                ) from exc
            raise

    def _tenant(self) -> str:
        tenant = self.ctl.tenant
        return f"tenant {tenant!r}" if tenant else "this tenant"

    def _taken(self, checkpoint_id: str) -> str:
        """What to do when the archive's ``checkpoint_id`` is taken in the tenant:
        an import keeps checkpoint IDs, which are unique within a tenant."""
        holder = self._holder(checkpoint_id)
        where = f"session {holder!r} already has" if holder else "another session has"
        remedy = f"delete session {holder!r} first" if holder else "delete that session first"
        return (
            f"{where} checkpoint {checkpoint_id!r} in {self._tenant()}, and an import keeps the "
            "archive's checkpoint IDs (unique within a tenant; --session-id renames only the "
            f"session): import into another --tenant, or {remedy}"
        )

    def _holder(self, checkpoint_id: str) -> str:
        """The archive's original session if it is in this tenant and holds
        ``checkpoint_id`` (the usual case: an archive imported back into the
        tenant it was exported from), else ""."""
        original = self.manifest.session.session_id
        if original == self.session_id:  # the import's own session, deleted by now
            return ""
        return original if self._holds_archived(original, checkpoint_id) else ""

    def _holds_archived(self, session_id: str, checkpoint_id: str = "") -> bool:
        """Whether ``session_id`` holds ``checkpoint_id`` (default: any of the archive's)."""
        wanted = (
            {checkpoint_id}
            if checkpoint_id
            else {c.checkpoint_id for c in self.manifest.checkpoints}
        )
        try:
            return any(c.checkpoint_id in wanted for c in self.client.list_checkpoints(session_id))
        except StratadError:
            return False

    def _checkpoints(self) -> None:
        checkpoints = self.manifest.checkpoints
        with self.ctl.progress(f"import {self.session_id}", len(checkpoints)) as progress:
            for cp, data in self.reader.states():
                self.current = cp.checkpoint_id
                if cp.name:
                    self._named(cp, data)
                else:
                    self._save(cp, data, cp.checkpoint_id)
                self._put_writes(cp)
                self.imported.add(cp.checkpoint_id)
                progress.advance()
            self.current = ""

    def _set_structured(self, blob: ArchivedBlob | None) -> None:
        """Make the session's structured state ``blob``'s (None: none) before a capture.

        Never called for an archive without structured state (a version 1
        archive, or a session that had none): its import needs no more than
        a daemon that predates ReplaceStructuredState.
        """
        if not self.has_structured:
            return
        data = self.reader.blob("structured state", blob) if blob is not None else b"{}"
        request = session_pb2.ReplaceStructuredStateRequest(
            session_id=self.session_id, structured_json=data
        )
        self.client.call(self.client.sessions.ReplaceStructuredState, request)

    def _put_writes(self, cp: ArchivedCheckpoint) -> None:
        """The checkpoint's pending writes, one PutWrites per task (in the archive's order)."""
        tasks: dict[tuple[str, str], list[tuple[int, str, str, bytes]]] = {}
        for w in cp.pending_writes:
            value = self.reader.blob(f"pending write {w.task_id}/{w.idx}", w.value)
            tasks.setdefault((w.task_id, w.task_path), []).append((w.idx, w.channel, w.type, value))
        for (task_id, task_path), writes in tasks.items():
            self.client.put_writes(
                self.session_id, cp.checkpoint_id, task_id, writes, task_path=task_path
            )

    def _save(self, cp: ArchivedCheckpoint, data: bytes, checkpoint_id: str) -> str:
        parent = cp.parent_checkpoint_id if cp.parent_checkpoint_id in self.imported else ""
        self._set_structured(cp.structured)  # what the save captures with the checkpoint
        saved = self.client.save_state(
            self.session_id,
            data,
            content_type=cp.content_type,
            metadata=cp.metadata,
            checkpoint_id=checkpoint_id,
            parent_checkpoint_id=parent,
            namespace=cp.namespace,
        )
        if saved.digest != cp.digest:
            raise CtlError(f"checkpoint {cp.checkpoint_id}: the daemon stored another digest")
        self.head = saved.checkpoint_id
        return str(saved.checkpoint_id)

    def _named(self, cp: ArchivedCheckpoint, data: bytes) -> None:
        """A named checkpoint pins the head: make its parent the head, then pin it."""
        parent = cp.parent_checkpoint_id
        temporary = ""
        if parent in self.imported and self._digest_of(parent) == cp.digest:
            if self.head != parent:
                self.client.restore_checkpoint(parent, make_current=True)
                self.head = parent
        else:
            # The parent is not in the archive (dropped by retention or deleted):
            # save the state under a temporary ID, pin it, then delete it.
            temporary = self._save(cp, data, "")
        self._set_structured(cp.structured)
        created = self.client.create_checkpoint(
            self.session_id, cp.name, metadata=cp.metadata, checkpoint_id=cp.checkpoint_id
        )
        self.head = created.checkpoint_id
        if temporary:
            self.client.delete_checkpoint(temporary)
        if created.digest != cp.digest:
            raise CtlError(f"checkpoint {cp.checkpoint_id}: the daemon pinned another digest")

    def _digest_of(self, checkpoint_id: str) -> str:
        for cp in self.manifest.checkpoints:
            if cp.checkpoint_id == checkpoint_id:
                return cp.digest
        return ""

    def _finish(self) -> None:
        s = self.manifest.session
        if s.head_checkpoint_id in self.imported and self.head != s.head_checkpoint_id:
            self.client.restore_checkpoint(s.head_checkpoint_id, make_current=True)
        # Last: restoring a checkpoint brings back the structured state it captured.
        self._set_structured(s.structured)
        listed = {c.checkpoint_id: c.digest for c in self.client.list_checkpoints(self.session_id)}
        expected = {c.checkpoint_id: c.digest for c in self.manifest.checkpoints}
        if listed != expected:
            missing = sorted(set(expected) - set(listed))
            extra = sorted(set(listed) - set(expected))
            raise CtlError(
                f"the imported session does not hold the archive's checkpoints "
                f"(missing: {missing[:5]}, unexpected: {extra[:5]})"
            )
        if s.status == "paused":
            self.client.pause_execution(self.session_id)
            self.status = "paused"
        elif s.status not in ("", "active"):
            self.notes.append(
                f"the session was {s.status} in the archive; the API cannot set that status, "
                "so it was imported as active"
            )
        if s.forked_from_checkpoint_id:
            self.notes.append(
                f"the session was forked from checkpoint {s.forked_from_checkpoint_id}; "
                "an imported session records no fork origin"
            )


# --- tokens (offline) ---------------------------------------------------------------------


def run_token(args: argparse.Namespace) -> int:
    """``token new`` / ``token hash``: what docs/security.md tells operators to run."""
    if args.token_command == "hash":
        token = sys.stdin.readline().strip()
        if not token:
            print("stratad ctl: token hash reads a token on stdin; got none", file=sys.stderr)
            return EXIT_USAGE
        print(token_digest(token))
        return EXIT_OK
    token = secrets.token_urlsafe(32)
    entry = {"tenant": args.for_tenant, "role": args.role}
    if args.name:
        entry["name"] = args.name
    fields = ", ".join(f"{key} = {json.dumps(value)}" for key, value in entry.items())
    print(token)
    print(f'"{token_digest(token)}" = {{ {fields} }}')
    return EXIT_OK


def _iter_commands() -> Iterator[tuple[tuple[str, ...], Callable[[Ctl, argparse.Namespace], int]]]:
    yield ("health",), cmd_health
    yield ("sessions", "ls"), cmd_sessions_ls
    yield ("sessions", "show"), cmd_sessions_show
    yield ("sessions", "rm"), cmd_sessions_rm
    yield ("sessions", "watch"), cmd_sessions_watch
    yield ("checkpoints", "ls"), cmd_checkpoints_ls
    yield ("checkpoints", "show"), cmd_checkpoints_show
    yield ("checkpoints", "diff"), cmd_checkpoints_diff
    yield ("state", "get"), cmd_state_get
    yield ("verify",), cmd_verify
    yield ("gc",), cmd_gc
    yield ("stats",), cmd_stats
    yield ("replication", "status"), cmd_replication_status
    yield ("restore",), cmd_restore
    yield ("export",), cmd_export
    yield ("import",), cmd_import


COMMANDS: dict[tuple[str, ...], Callable[[Ctl, argparse.Namespace], int]] = dict(_iter_commands())

__all__ = ["COMMANDS", "EXIT_FAILED", "EXIT_OK", "EXIT_PROBLEMS", "Ctl", "run"]
