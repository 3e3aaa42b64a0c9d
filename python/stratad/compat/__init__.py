"""Facades that keep the seeds' own Python signatures, backed by a stratad daemon.

Code written against one of the seed systems (MARSYS's ``StateManager``,
AIWhisperer's ``save_state`` / ``load_state``, ...) moves to stratad by
changing its import and naming the daemon's address; the state then lives in
the sidecar with stratad's guarantees (journaled before acknowledged, every
byte verified on read) instead of in local files. There is one submodule per
seed system, e.g. `stratad.compat.marsys` and `stratad.compat.aiwhisperer`.

Submodules are imported explicitly; importing this package loads none of them.
"""
