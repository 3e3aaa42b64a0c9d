"""The ``stratad`` command.

    stratad --version
    stratad serve [--config FILE] [--listen ADDR] [--data-dir DIR] ...
    stratad ctl [--address ADDR] COMMAND ...   (see stratad/ctl/__init__.py)
    stratad mcp ...                            (see stratad/mcp/cli.py)
    stratad keygen | rotate-key ...

This module runs what the parser (`stratad.cli_parser`) parsed.

Exit codes: 0 after a clean shutdown, 1 when the daemon cannot start (data
directory in use, address taken), 2 for usage and configuration errors, and
for `serve`, `keygen` and `rotate-key` where the daemon's dependencies (the
``server`` extra) are not installed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from stratad import ctl
from stratad.cli_parser import build_parser
from stratad.config import OPTIONS, Config, ConfigError, load_config
from stratad.errors import StratadError
from stratad.mcp.cli import run_mcp

EXIT_OK = 0
EXIT_START_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: The top-level modules of the ``server`` extra's packages (pyproject.toml):
#: what the daemon imports and an agent's plain ``pip install stratad`` lacks.
DAEMON_MODULES: Final = frozenset(
    {"grpc_reflection", "prometheus_client", "obstore", "cryptography", "orjson"}
)
SERVER_INSTALL: Final = "pip install 'stratad[server]'"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stratad`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "mcp":
        return run_mcp(args)
    if args.command == "ctl":
        return ctl.main(args, parser)
    if args.command == "keygen":
        try:
            from stratad.store.crypto import new_master_key_text
        except ImportError as exc:
            return _without_server_extra("keygen", exc)
        print(new_master_key_text())
        return 0
    if args.command == "rotate-key":
        return _rotate_key(args)
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _serve(args: argparse.Namespace) -> int:
    # Imported here so that `stratad --version` and config errors stay fast
    # and do not need grpc, and so that the rest of the command works where
    # only the SDK's dependencies are installed.
    try:
        from stratad.server.app import serve
        from stratad.server.logging_setup import setup_logging
    except ImportError as exc:
        return _without_server_extra("serve", exc)

    try:
        flags = {option.name: getattr(args, option.name) for option in OPTIONS}
        config = load_config(flags, os.environ, args.config)
    except ConfigError as exc:
        return _fail(f"config error: {exc.message}", EXIT_USAGE)
    if args.check_config:
        problem = _config_file_problem(config)
        if problem is not None:
            return _fail(f"config error: {problem}", EXIT_USAGE)
        print(f"stratad: config OK: listen={config.listen} data_dir={config.data_dir}")
        return 0
    setup_logging(config.log_level, config.log_format)
    try:
        return asyncio.run(serve(config))
    except StratadError as exc:
        return _fail(exc.message, EXIT_START_FAILED)
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed
        return EXIT_INTERRUPTED


def _config_file_problem(config: Config) -> str | None:
    """What is wrong with the files ``config`` names (serving reads them at start)."""
    from stratad.server.auth import load_identities

    for key in ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "encryption_key_file"):
        path = getattr(config, key)
        if path and not os.access(path, os.R_OK):
            return f"{key} = {path!r} cannot be read"
    if config.auth != "off" and config.auth_tokens_file:
        try:
            load_identities(Path(config.auth_tokens_file))
        except ConfigError as exc:
            return exc.message
    return None


def _rotate_key(args: argparse.Namespace) -> int:
    try:
        from stratad.store.crypto import rotate_data_dir
    except ImportError as exc:
        return _without_server_extra("rotate-key", exc)

    old = tuple(p.strip() for p in args.encryption_old_key_files.split(",") if p.strip())
    try:
        for tenant, before, after in rotate_data_dir(
            Path(args.data_dir), args.encryption_key_file, old, dict(os.environ)
        ):
            state = "already wrapped by" if before == after else f"re-wrapped from {before} to"
            print(f"tenant {tenant}: {state} {after}")
    except StratadError as exc:
        return _fail(exc.message, EXIT_START_FAILED)
    return 0


def _without_server_extra(command: str, exc: ImportError) -> int:
    """One line naming the extra when ``exc`` is a daemon dependency missing
    (an SDK-only install); any other import error is a bug: raised as is."""
    missing = (exc.name or "").partition(".")[0]
    if missing not in DAEMON_MODULES:
        raise exc
    print(
        f"stratad {command} needs the daemon's dependencies: {SERVER_INSTALL} "
        f"(no module named {missing!r})",
        file=sys.stderr,
    )
    return EXIT_USAGE


def _fail(message: str, code: int) -> int:
    print(f"stratad: {message}", file=sys.stderr)
    return code


__all__ = ["build_parser", "main"]
