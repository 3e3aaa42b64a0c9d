"""The read-only web inspector (``stratad serve --inspector 127.0.0.1:8080``).

A page a person opens in a browser to look inside the daemon: tenants and
their sessions (searched by ID or label), a session's checkpoint tree with
its forks and a JSON diff between any two checkpoints, the session's
cognitive state, tasks and agent state, and a tenant's crystals with their
scores. LangGraph checkpoints (StratadSaver's) are decoded, their messages
listed; times are ISO 8601 UTC. User guide: docs/inspector.md.

- `http`: a small asyncio HTTP/1.1 server (GET only);
- `reader`: the reads, over the domain layer, that never write;
- `jsondiff`: the structural diff of two JSON values;
- `server`: routes, the admin-token check, security headers;
- `static/`: the page (HTML, vanilla JavaScript and CSS; no build step).
"""

from __future__ import annotations

from stratad.server.inspector.server import Inspector, start_inspector

__all__ = ["Inspector", "start_inspector"]
