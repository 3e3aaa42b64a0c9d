"""stratad's version, from the installed package's metadata.

Its own module so that any layer (tracing, the CLI, the daemon) can read it
without importing the `stratad` package's SDK entry points.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("stratad")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
