"""The argument parser of the ``stratad`` command: ``serve`` (one flag per config
option), ``ctl`` (`stratad.ctl.parser`), ``mcp`` (`stratad.mcp.cli`), ``keygen``
and ``rotate-key``.

`stratad.cli` parses with it and runs the command; `stratad.ctl.completion`
writes shell completion scripts from it. It imports parsers only (argparse,
the config options), never what runs a command, so that both can import it
without a cycle and ``stratad --version`` stays fast.
"""

from __future__ import annotations

import argparse

from stratad import __version__
from stratad.config import CONFIG_FILE_ENV, OPTIONS, Option
from stratad.ctl.parser import add_parser as add_ctl_parser
from stratad.mcp.cli import add_mcp_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stratad",
        description="stratad: a durable state sidecar for AI agents, served over gRPC.",
    )
    parser.add_argument("--version", action="version", version=f"stratad {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_serve(commands)
    add_ctl_parser(commands)
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


__all__ = ["build_parser"]
