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
from pathlib import Path

from stratad import __version__, ctl
from stratad.config import CONFIG_FILE_ENV, OPTIONS, Config, ConfigError, Option, load_config
from stratad.errors import StratadError
from stratad.mcp.cli import add_mcp_parser, run_mcp

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
    add_mcp_parser(commands)
    _add_key_commands(commands)
    return parser


def _add_key_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    commands.add_parser(
        "keygen",
        help="print a new random 256-bit master key (64 hex digits) for encryption at rest",
        description="Print a new master key for encryption_key_file. Store it like a "
        "password: without it, an encrypted data directory cannot be read.",
    )
    rotate = commands.add_parser(
        "rotate-key",
        help="re-wrap every tenant's data key with a new master key (offline; no data rewritten)",
        description="Offline master-key rotation for encryption at rest: with the daemon "
        "stopped, unwrap each tenant's data key with one of the old keys and wrap it with "
        "the new one. Afterwards only the new key is needed. (A daemon started with "
        "encryption_old_key_files does the same at start, and also updates the keys kept "
        "in object storage when replication is on.)",
    )
    rotate.add_argument("--data-dir", required=True, metavar="DIR", help="the data directory")
    rotate.add_argument(
        "--encryption-key-file",
        default="",
        metavar="FILE",
        help="the new master key (default: STRATAD_ENCRYPTION_KEY holds it)",
    )
    rotate.add_argument(
        "--encryption-old-key-files",
        required=True,
        metavar="FILES",
        help="the old master key files, comma-separated",
    )


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
    serve.add_argument(
        "--check-config",
        action="store_true",
        help="check the configuration (file, environment, flags) the way serving would, "
        "including that the files it names (TLS, tokens, keys) can be read and the tokens "
        "file parsed; print it and exit: 0 if it is valid, 2 with the error if not "
        "(nothing is started)",
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
    if args.command == "mcp":
        return run_mcp(args)
    if args.command == "ctl":
        return ctl.main(args)
    if args.command == "keygen":
        from stratad.store.crypto import new_master_key_text

        print(new_master_key_text())
        return 0
    if args.command == "rotate-key":
        return _rotate_key(args)
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
    from stratad.store.crypto import rotate_data_dir

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


def _fail(message: str, code: int) -> int:
    print(f"stratad: {message}", file=sys.stderr)
    return code


__all__ = ["build_parser", "main"]
