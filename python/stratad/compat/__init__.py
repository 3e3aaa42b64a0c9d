"""Facades that keep corteX's, AIWhisperer's, Cogency's and MARSYS's Python APIs, on stratad.

Code written against one of these systems (MARSYS's ``StateManager``,
AIWhisperer's ``save_state`` / ``load_state``, ...) moves to stratad by
changing its import and naming the daemon's address; the state then lives in
the sidecar with stratad's guarantees (journaled before acknowledged, every
byte verified on read) instead of in local files. There is one submodule per
system, e.g. `stratad.compat.marsys` and `stratad.compat.aiwhisperer`; docs/design.md
("Where the features come from") lists them and the services behind them.

Submodules are imported explicitly; importing this package loads none of them.
"""
