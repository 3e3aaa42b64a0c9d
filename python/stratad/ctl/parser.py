"""The argument parser of ``stratad ctl``: its subcommands, their options, and the
global options (connection, output) every subcommand accepts too.

Only argparse and the standard library: building the ``stratad`` parser (and
``stratad --version``) must not import grpc. `stratad.cli_parser` adds this to
the whole ``stratad`` command; the commands themselves are in
`stratad.ctl.commands`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

# stratad.sdk.constants imports nothing (stratad.sdk.connection would import grpc):
# the parser stays light.
from stratad.sdk.constants import (
    ADDRESS_ENV,
    DEFAULT_ADDRESS,
    TENANT_ENV,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_ENV,
    TLS_KEY_ENV,
    TLS_SERVER_NAME_ENV,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ctl`` and its subcommands to the ``stratad`` parser."""
    ctl = commands.add_parser(
        "ctl",
        help="operate a running daemon: sessions, state, verify, gc, stats, export, import",
        description="Operate a running stratad daemon over gRPC. Exit codes: 0 success, "
        "1 failure, 2 usage, 3 verify found problems. The options below are global: they "
        "may also follow the command (stratad ctl sessions ls --json); a command's own "
        "--help lists only its own options.",
    )
    _add_global_options(ctl)
    sub = ctl.add_subparsers(dest="ctl_command", metavar="COMMAND", required=True)

    health = sub.add_parser("health", help="exit 0 if the daemon reports SERVING, else 1")
    health.add_argument("--service", default="", help="a service name (default: the server)")

    _add_sessions(sub)
    _add_checkpoints(sub)
    _add_state(sub)

    sub.add_parser("verify", help="re-hash every object of the tenant; exit 3 on problems")
    sub.add_parser("gc", help="remove objects no checkpoint references")
    sub.add_parser("stats", help="store statistics: sessions, bytes, dedup and compression")

    replication = sub.add_parser("replication", help="replication to object storage")
    replication_sub = replication.add_subparsers(
        dest="replication_command", metavar="ACTION", required=True
    )
    replication_sub.add_parser("status", help="mode, backlog and lag of the daemon's shipping")
    restore = sub.add_parser(
        "restore", help="replace the daemon's copy of a session with the one in object storage"
    )
    restore.add_argument("session_id")
    restore.add_argument(
        "--from-remote",
        action="store_true",
        required=True,
        help="restore from the object storage the daemon replicates to (the only source)",
    )

    export = sub.add_parser("export", help="write a session to one portable archive")
    export.add_argument("session_id")
    export.add_argument(
        "-o",
        "--output",
        default="",
        metavar="FILE",
        help="the archive to write (default: SESSION_ID.stratad.tar)",
    )
    _add_token_commands(sub)
    imp = sub.add_parser("import", help="re-create a session from an archive")
    imp.add_argument("archive", metavar="FILE")
    imp.add_argument(
        "--session-id", default="", help="import under this session ID (default: the original)"
    )
    imp.add_argument(
        "--verify-only",
        action="store_true",
        help="check the archive and exit; send nothing to the daemon",
    )
    imp.add_argument(
        "--max-state-bytes",
        type=_positive_int,
        # archive.DEFAULT_MAX_STATE_BYTES, not imported: the parser stays light
        default=64 << 20,
        metavar="N",
        help="refuse a checkpoint whose state is larger; set it to the daemon's maximum "
        "state size (default: %(default)s, 64 MiB)",
    )
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script for stratad (offline)",
        description="Print a completion script for the whole stratad command. Load it with "
        "`source <(stratad ctl completion bash)` (bash), "
        "`source <(stratad ctl completion zsh)` (zsh), or "
        "`stratad ctl completion fish | source` (fish); or save it where your shell "
        "loads completions from.",
    )
    completion.add_argument("shell", choices=SHELLS)
    _accept_global_options_after(ctl)


#: The shells `ctl completion` writes scripts for.
SHELLS = ("bash", "zsh", "fish")


#: The line a subcommand's --help ends with, in place of the global options.
GLOBAL_OPTIONS_EPILOG = (
    "global options (--json, --address, ...) work here too: `stratad ctl --help`"
)


def _add_global_options(parser: argparse.ArgumentParser, *, after: bool = False) -> None:
    """The connection and output options every command shares.

    On ``ctl`` itself they carry the defaults and their help; repeated on each
    subcommand (``after``) they default to nothing (SUPPRESS), so that a value
    given before the command is kept unless the same option follows it, and
    are left out of its --help, which points at ``stratad ctl --help`` instead.
    """

    def default(value: object) -> object:
        return argparse.SUPPRESS if after else value

    def shown(text: str) -> str:
        return argparse.SUPPRESS if after else text

    if after:
        parser.epilog = " ".join(filter(None, (parser.epilog, GLOBAL_OPTIONS_EPILOG)))
    parser.add_argument(
        "--address",
        default=default(os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS),
        metavar="ADDR",
        help=shown(
            f"the daemon: HOST:PORT or unix:/path (env: {ADDRESS_ENV}; default: {DEFAULT_ADDRESS})"
        ),
    )
    parser.add_argument(
        "--tenant",
        default=default(os.environ.get(TENANT_ENV, "")),
        help=shown(
            f"act in this tenant (env: {TENANT_ENV}; default: the daemon's 'default', "
            "or with auth on the credential's own tenant)"
        ),
    )
    _add_credentials(parser, default, shown)
    parser.add_argument(
        "--timeout",
        type=float,
        default=default(30.0),
        metavar="SECONDS",
        help=shown("deadline of each call (verify and gc: at least an hour) (default: 30)"),
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help=shown("print JSON for scripts"),
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default=default("auto"),
        help=shown(
            "progress line on stderr for verify, gc, export and import (auto: on a terminal)"
        ),
    )


def _accept_global_options_after(parser: argparse.ArgumentParser) -> None:
    """Repeat the global options on every subcommand below ``parser``."""
    for child in subcommands(parser).values():
        _add_global_options(child, after=True)
        _accept_global_options_after(child)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of ``parser`` by name (none for a leaf)."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _add_sessions(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sessions = sub.add_parser("sessions", help="list, show, watch or delete sessions")
    sessions_sub = sessions.add_subparsers(dest="sessions_command", metavar="ACTION", required=True)
    ls = sessions_sub.add_parser("ls", help="list sessions ordered by ID")
    ls.add_argument("--prefix", default="", help="only IDs starting with this")
    show = sessions_sub.add_parser("show", help="one session in detail")
    show.add_argument("session_id")
    rm = sessions_sub.add_parser("rm", help="delete sessions and their checkpoints")
    rm.add_argument("session_ids", nargs="+", metavar="session_id")
    watch = sessions_sub.add_parser(
        "watch",
        help="print the session's events as they happen, until Ctrl-C or its deletion",
        description="Stream WatchSession: one line per event (one JSON object per line with "
        "--json). A daemon that goes away is watched again (backoff up to 5 s) from the "
        "last version printed, so no event is lost or repeated. Ends with exit 0 when the "
        "session is deleted, 130 on Ctrl-C.",
    )
    watch.add_argument("session_id")
    watch.add_argument(
        "--from-version",
        type=int,
        default=0,
        metavar="V",
        help="first replay the events after version V (default: only new events)",
    )


def _add_checkpoints(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    checkpoints = sub.add_parser("checkpoints", help="list, show and compare checkpoints")
    cp_sub = checkpoints.add_subparsers(dest="checkpoints_command", metavar="ACTION", required=True)
    cp_ls = cp_sub.add_parser("ls", help="checkpoints of a session, newest first")
    cp_ls.add_argument("session_id")
    cp_ls.add_argument("--namespace", default=None, help="only this namespace")
    cp_ls.add_argument("--limit", type=int, default=0, help="at most this many (0 = all)")
    show = cp_sub.add_parser(
        "show", help="one checkpoint: metadata, parents, size, and its state decoded"
    )
    show.add_argument("session_id")
    show.add_argument("checkpoint_id")
    _add_decode(show)
    diff = cp_sub.add_parser(
        "diff",
        help="what changed from checkpoint A to B: added, removed and changed JSON paths",
        description="Compare two states. JSON states (or LangGraph checkpoints with "
        "--decode langgraph) are compared value by value and each difference is named by "
        "its JSON path; other states get a byte-level summary. Exit 0 whether or not they "
        "differ.",
    )
    diff.add_argument("session_id")
    diff.add_argument("checkpoint_a", metavar="A")
    diff.add_argument("checkpoint_b", metavar="B")
    _add_decode(diff)


def _add_decode(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--decode",
        choices=DECODERS,
        default="auto",
        help="how to read the state: auto (LangGraph if StratadSaver wrote it, else JSON if "
        "it parses, else bytes), json, langgraph, or raw (default: auto)",
    )


#: How `--decode` may read a state (see stratad.ctl.decode).
DECODERS = ("auto", "json", "langgraph", "raw")


def _add_state(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    state = sub.add_parser("state", help="read a saved state")
    state_sub = state.add_subparsers(dest="state_command", metavar="ACTION", required=True)
    get = state_sub.add_parser(
        "get", help="write a state's bytes to stdout or a file (latest, or --checkpoint)"
    )
    get.add_argument("session_id")
    get.add_argument("--checkpoint", default="", metavar="ID", help="this checkpoint")
    get.add_argument("--namespace", default="", help="the latest state of this namespace")
    get.add_argument(
        "-o", "--output", default="-", metavar="FILE", help="write here (default: stdout)"
    )
    get.add_argument(
        "--decode",
        choices=("langgraph",),
        default=None,
        help="langgraph: decode a checkpoint StratadSaver stored (its serializer's bytes) "
        "and print it as JSON (needs langgraph installed)",
    )


def _add_credentials(
    group: Any, default: Callable[[object], object], shown: Callable[[str], str]
) -> None:
    """--token and --tls* flags; unset ones come from the environment in the SDK."""
    group.add_argument(
        "--token-file",
        metavar="FILE",
        default=default(None),
        help=shown(
            f"read the bearer token from FILE (env: {TOKEN_FILE_ENV}, or the token itself "
            f"in {TOKEN_ENV}; a token on the command line would show in ps)"
        ),
    )
    group.add_argument(
        "--tls",
        action="store_true",
        default=default(None),
        help=shown(f"connect with TLS, trusting the system's CAs unless --tls-ca (env: {TLS_ENV})"),
    )
    for flag, env, text in (
        ("--tls-ca", TLS_CA_ENV, "PEM CA file that signed the daemon's certificate"),
        ("--tls-cert", TLS_CERT_ENV, "client certificate (PEM) for mTLS"),
        ("--tls-key", TLS_KEY_ENV, "the client certificate's key (PEM)"),
        (
            "--tls-server-name",
            TLS_SERVER_NAME_ENV,
            "name to verify the daemon's certificate for, if not the host dialed",
        ),
    ):
        group.add_argument(flag, metavar="FILE" if "name" not in flag else "NAME",
                           default=default(None),
                           help=shown(f"{text}; implies --tls (env: {env})"))  # fmt: skip


def _add_token_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = sub.add_parser(
        "token", help="make bearer tokens and their identities-file entries (offline)"
    )
    token_sub = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    new = token_sub.add_parser(
        "new", help="print a new random token, then the TOML line for auth_tokens_file"
    )
    new.add_argument("--for-tenant", default="default", metavar="TENANT", help="its tenant")
    new.add_argument("--role", choices=("agent", "admin"), default="agent", help="its role")
    new.add_argument("--name", default="", help="the name audit lines show for it")
    token_sub.add_parser(
        "hash", help="read a token on stdin, print its SHA-256 (the identities-file key)"
    )


__all__ = [
    "ADDRESS_ENV",
    "DECODERS",
    "DEFAULT_ADDRESS",
    "GLOBAL_OPTIONS_EPILOG",
    "SHELLS",
    "TENANT_ENV",
    "add_parser",
    "subcommands",
]
