"""A LangGraph checkpointer that keeps every checkpoint in a stratad daemon.

    from stratad.integrations.langgraph import StratadSaver

    graph = builder.compile(checkpointer=StratadSaver("127.0.0.1:50051"))

How LangGraph's model maps onto stratad (see docs/langgraph.md):

- a thread is a session (its ID when it is a valid stratad ID, else
  `lg-<hash>`; the thread ID is kept in the session's labels);
- `checkpoint_ns` is the checkpoint's namespace;
- a LangGraph checkpoint ID becomes the stratad checkpoint ID
  `<checkpoint id>.<16 hex of hash(thread, namespace)>` (stratad IDs are unique
  in a tenant, LangGraph's only in a thread), its parent the stratad parent;
- the checkpoint is saved as the state's bytes in the layout of `encode_layout`
  (content type `application/vnd.langgraph.checkpoint+<serde type>`): every
  element of a list channel (a message history) is serialized on its own with
  the saver's `serde`, lists first, then the other channels, and the rest of the
  checkpoint (IDs, versions, metadata, parent) last, so a growing list grows the
  state at its end only and stratad's content-defined chunking and deltas store
  and send only what a step added. A value whose channel version did not change,
  and list elements already serialized (the same objects), are not serialized
  again. Checkpoints of earlier versions (the whole `serde.dumps_typed` of
  {checkpoint, metadata, parent_checkpoint_id}) still load. The metadata is also
  stored as the checkpoint's metadata Struct, which `list(filter=...)` and
  `delete_for_runs` match on;
- pending writes are stratad pending writes (PutWrites), keyed by
  (task_id, idx) with LangGraph's WRITES_IDX_MAP for special channels;
- `copy_thread` is CopySession (no state data is copied), `prune` is
  PruneCheckpoints, `delete_for_runs` is DeleteCheckpoints on `run_id`.

Both the blocking methods (a `stratad.Client`) and the async ones (an
`AsyncClient` per event loop) talk to the daemon directly.

The package, by concern (each module says what it owns):

- saver.py: `StratadSaver` and its blocking methods;
- aio.py: its async methods;
- core.py: what both share (clients, requests, loaded states as tuples);
- ids.py: threads and checkpoint IDs as stratad IDs;
- layout.py: the stored layout ("SLG2", docs/langgraph.md) and its decoding;
- encoder.py: encoding into it, serializing only what changed.
"""

from __future__ import annotations

from stratad.integrations.langgraph.encoder import encode_layout
from stratad.integrations.langgraph.ids import INTEGRATION_LABEL as INTEGRATION_LABEL
from stratad.integrations.langgraph.ids import THREAD_LABEL as THREAD_LABEL
from stratad.integrations.langgraph.ids import langgraph_checkpoint_id as langgraph_checkpoint_id
from stratad.integrations.langgraph.ids import session_id_of as session_id_of
from stratad.integrations.langgraph.ids import stratad_checkpoint_id as stratad_checkpoint_id
from stratad.integrations.langgraph.layout import CONTENT_TYPE_PREFIX as CONTENT_TYPE_PREFIX
from stratad.integrations.langgraph.layout import LAYOUT_MAGIC as LAYOUT_MAGIC
from stratad.integrations.langgraph.layout import decode_layout, is_layout
from stratad.integrations.langgraph.layout import encode_piece as encode_piece
from stratad.integrations.langgraph.saver import StratadSaver

__all__ = ["StratadSaver", "decode_layout", "encode_layout", "is_layout"]
