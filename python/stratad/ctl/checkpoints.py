"""``stratad ctl checkpoints ls|show|diff`` and ``state get``: a session's
checkpoints, one checkpoint with its state decoded, what changed between two
states, and a state's bytes (or a LangGraph checkpoint decoded to JSON)."""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from stratad.ctl import decode
from stratad.ctl.context import EXIT_OK, Ctl, human_bytes, table, to_dict, when


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


__all__ = [
    "cmd_checkpoints_diff",
    "cmd_checkpoints_ls",
    "cmd_checkpoints_show",
    "cmd_state_get",
    "write_atomically",
]
