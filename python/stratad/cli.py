"""The ``stratad`` command.

    stratad --version
    stratad serve [--config FILE] [--listen ADDR] [--data-dir DIR] ...
    stratad ctl [--address ADDR] COMMAND ...   (see stratad/ctl/__init__.py)

Exit codes: 0 after a clean shutdown, 1 when the daemon cannot start (data
directory in use, address taken), 2 for usage and configuration errors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from stratad import __version__, ctl
from stratad.config import CONFIG_FILE_ENV, OPTIONS, ConfigError, Option, load_config
from stratad.errors import StratadError

EXIT_OK = 0
EXIT_START_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stratad",
        description="stratad: a durable state sidecar for AI agents, served over gRPC.",
    )
    parser.add_argument("--version", action="version", version=f"stratad {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_serve(commands)
    ctl.add_parser(commands)
    return parser


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the daemon until SIGTERM or SIGINT",
        description="Run the stratad daemon. Every option can also come from a STRATAD_* "
        "environment variable or the config file; precedence is flags > environment > "
        "config file > defaults.",
    )
    serve.add_argument(
        "--config",
        metavar="FILE",
        help=f"TOML config file whose top-level keys are the option names below with "
        f"underscores (e.g. data_dir = ...) (env: {CONFIG_FILE_ENV}; default: none)",
    )
    for option in OPTIONS:
        # default=None marks "not given", so lower layers are not overridden.
        serve.add_argument(
            option.flag,
            *_FLAG_ALIASES.get(option.name, ()),
            dest=option.name,
            metavar=option.metavar,
            help=_flag_help(option),
        )


#: Shorter spellings of some flags (the config key keeps its full name).
_FLAG_ALIASES: dict[str, tuple[str, ...]] = {"inspector_listen": ("--inspector",)}


def _flag_help(option: Option) -> str:
    text = f"{option.help} (env: {option.env_var}; default: {option.default})"
    return text.replace("%", "%%")  # argparse %-formats help strings


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stratad`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "ctl":
        return ctl.main(args)
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _serve(args: argparse.Namespace) -> int:
    # Imported here so that `stratad --version` and config errors stay fast
    # and do not need grpc.
    from stratad.server.app import serve
    from stratad.server.logging_setup import setup_logging

    try:
        flags = {option.name: getattr(args, option.name) for option in OPTIONS}
        config = load_config(flags, os.environ, args.config)
    except ConfigError as exc:
        return _fail(f"config error: {exc.message}", EXIT_USAGE)
    setup_logging(config.log_level, config.log_format)
    try:
        return asyncio.run(serve(config))
    except StratadError as exc:
        return _fail(exc.message, EXIT_START_FAILED)
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed
        return EXIT_INTERRUPTED


def _fail(message: str, code: int) -> int:
    print(f"stratad: {message}", file=sys.stderr)
    return code


__all__ = ["build_parser", "main"]
