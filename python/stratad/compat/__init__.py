"""Facades that keep the seeds' own Python signatures, backed by a stratad daemon.

Code written against MARSYS's ``StateManager`` or AIWhisperer's ``save_state`` /
``load_state`` moves to stratad by changing its import (and naming the daemon's
address); the state then lives in the sidecar with stratad's guarantees
(journaled before acknowledged, every byte verified on read) instead of in
local JSON files.

- `stratad.compat.marsys`: ``StateManager``, ``StateSnapshot``, ``StorageBackend``,
  ``SidecarStorageBackend``.
- `stratad.compat.aiwhisperer`: ``configure``, ``save_state``, ``load_state``.

Submodules are imported explicitly; importing this package loads neither.
"""
