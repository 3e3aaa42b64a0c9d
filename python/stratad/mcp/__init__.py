"""``stratad mcp``: the daemon's state as Model Context Protocol tools, resources and prompts.

A thin MCP server over a running daemon, built with the official MCP Python SDK
(the ``mcp`` extra): it keeps no state of its own, every tool call, resource
read and subscription is a call to the daemon. See docs/mcp.md.

- `stratad.mcp.cli`: the command line (`add_mcp_parser`, `run_mcp`);
- `stratad.mcp.server`: the MCP server, over stdio or streamable HTTP;
- `stratad.mcp.tools`, `stratad.mcp.resources`, `stratad.mcp.prompts`: what it serves;
- `stratad.mcp.daemon`: its link to the daemon.

Importing this package does not import the MCP SDK.
"""

from stratad.mcp.cli import add_mcp_parser, run_mcp

__all__ = ["add_mcp_parser", "run_mcp"]
