"""The operator's commands about the daemon as a whole: ``health``, ``verify``,
``gc``, ``stats``, ``replication status`` and ``restore --from-remote`` (the
long ones with a spinner and a deadline of at least an hour)."""

from __future__ import annotations

import argparse
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stratad.api.v1 import admin_pb2
from stratad.ctl.context import EXIT_FAILED, EXIT_OK, EXIT_PROBLEMS, Ctl, human_bytes, to_dict
from stratad.sdk.client import to_error

#: Verify and CollectGarbage walk the whole store: never give them less than this.
MAINTENANCE_TIMEOUT = 3600.0


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


__all__ = [
    "MAINTENANCE_TIMEOUT",
    "cmd_gc",
    "cmd_health",
    "cmd_replication_status",
    "cmd_restore",
    "cmd_stats",
    "cmd_verify",
]
