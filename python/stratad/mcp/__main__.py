"""``python -m stratad.mcp [OPTIONS]``: the same as ``stratad mcp [OPTIONS]``."""

import sys

from stratad.mcp.cli import main

sys.exit(main())
