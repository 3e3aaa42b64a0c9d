"""``stratad ctl sessions ls|show|rm|watch``: the tenant's sessions, and a session's
events as they happen (watched again from the last version printed when the
daemon goes away)."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator

from stratad.api.v1 import session_pb2
from stratad.ctl.context import (
    EXIT_OK,
    STATUS_NAMES,
    Ctl,
    CtlError,
    session_dict,
    table,
    to_dict,
    when,
)
from stratad.errors import NotFoundError, UnavailableError


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


__all__ = ["cmd_sessions_ls", "cmd_sessions_rm", "cmd_sessions_show", "cmd_sessions_watch"]
