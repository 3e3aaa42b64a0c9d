"""How data/ and expected.json here were made: run with stratad 62036f9 (before journal
records were lean and compressed), from a checkout of it:

    PYTHONPATH=python python make.py OUT_DIR

OUT_DIR/data is the engine's data directory (three sessions: saves with
retention drops, a named checkpoint, a compaction snapshot followed by more
records, structured state, pending writes, status changes, a fork and a
copy); OUT_DIR/expected.json is what replaying them must give.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.domain.models import SessionStatus
from stratad.domain.writes import WriteInput

T = "default"
SESSIONS = ("legacy", "legacy-fork", "legacy-copy")


def state(i: int) -> bytes:
    """Compressible JSON; from step 6 on, more than one chunk (a manifest)."""
    text = "lorem ipsum " * 40
    messages = [{"role": "user", "content": f"message {j} {text}"} for j in range(1 + i * i * 6)]
    return json.dumps({"step": i, "messages": messages}).encode()


def main(out: Path) -> None:
    e = Engine(out / "data", fsync_interval=3600.0)
    e.open()
    e.sessions.create(T, "legacy", labels={"team": "a"}, keep_last=4)
    for i in range(4):
        metadata = {"i": i} if i % 2 else {}
        e.checkpoints.save_state(T, "legacy", SaveInput(data=state(i), metadata=metadata))
    named = e.checkpoints.create_checkpoint(T, "legacy", name="first-four", metadata={"n": 1})
    e.sessions.compact(T, "legacy")  # a snapshot, then more records
    e.cognitive.initialize(T, "legacy", goal="replay old journals")
    e.cognitive.record_decision(T, "legacy", step=1, decision="keep them readable")
    for i in range(4, 8):
        inp = SaveInput(
            data=state(i), namespace="ns" if i == 5 else "", content_type="application/json"
        )
        e.checkpoints.save_state(T, "legacy", inp)
    last = e.checkpoints.save_state(T, "legacy", SaveInput(data=state(8))).checkpoint
    write = WriteInput(0, "messages", "json", b'{"x":1}')
    e.checkpoint_extras.put_writes(T, "legacy", last.checkpoint_id, "task-1", [write])
    e.checkpoints.set_status(T, "legacy", SessionStatus.PAUSED)
    e.checkpoints.set_status(T, "legacy", SessionStatus.ACTIVE)
    e.checkpoints.fork_session(T, named.checkpoint_id, new_session_id="legacy-fork")
    e.checkpoint_extras.copy_session(T, "legacy", target_session_id="legacy-copy")
    expected = {}
    for sid in SESSIONS:
        st = e.sessions.live(T, sid).state
        checkpoints = [
            {
                "checkpoint": cp.to_json(),
                "sha256": hashlib.sha256(
                    e.checkpoints.load_state(T, sid, cp.checkpoint_id).data
                ).hexdigest(),
            }
            for cp in st.checkpoints.values()
        ]
        expected[sid] = {
            "version": st.version,
            "status": st.status.value,
            "head": st.head,
            "labels": st.labels,
            "forked_from": st.forked_from,
            "keep_last": st.keep_last,
            "created_at": st.created_at,
            "updated_at": st.updated_at,
            "structured": st.structured,
            "checkpoints": checkpoints,
        }
    e.close()
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
