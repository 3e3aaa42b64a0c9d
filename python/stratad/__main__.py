"""``python -m stratad``: the same as the ``stratad`` command."""

from stratad.cli import main

raise SystemExit(main())
