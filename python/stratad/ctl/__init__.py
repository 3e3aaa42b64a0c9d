"""``stratad ctl``: operate a running daemon over its gRPC API.

    stratad ctl [--address ADDR] [--tenant T] [--json] COMMAND ...

    health                         SERVING or not (exit 0 / 1); the container's health check
    sessions ls [--prefix P]       sessions of the tenant
    sessions show ID               one session
    sessions rm ID                 delete a session and its checkpoints
    checkpoints ls SESSION         checkpoints, newest first
    state get SESSION [-o FILE]    a state's bytes (latest, or --checkpoint ID)
    verify                         re-hash every object of the tenant (exit 3 on problems)
    gc                             collect garbage
    stats                          store statistics
    export SESSION -o FILE         the session as one portable archive (see ctl/archive.py)
    import FILE                    re-create an exported session; refuses a damaged archive
    token new [--tenant T] [--role R]  a random token and its identities-file entry (offline)
    token hash                     the SHA-256 digest of a token read from stdin (offline)

Connection flags default to the SDK's variables (`stratad.sdk.connection`):
STRATAD_ADDRESS, STRATAD_TENANT, STRATAD_TOKEN / STRATAD_TOKEN_FILE, STRATAD_TLS,
STRATAD_TLS_CA, STRATAD_TLS_CERT, STRATAD_TLS_KEY, STRATAD_TLS_SERVER_NAME.

This module only builds the argument parser (``stratad --version`` stays
fast); the commands live in `stratad.ctl.commands`.

Exit codes: 0 success, 1 the operation failed (message on stderr), 2 usage,
3 verify found corrupt objects or damaged sessions.
"""

from __future__ import annotations

import argparse
import os

# The same names as stratad.sdk.connection, which is not imported: the parser stays light.
ADDRESS_ENV = "STRATAD_ADDRESS"
TENANT_ENV = "STRATAD_TENANT"
DEFAULT_ADDRESS = "127.0.0.1:50051"


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
        "1 failure, 2 usage, 3 verify found problems.",
    )
    ctl.add_argument(
        "--address",
        default=os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS,
        metavar="ADDR",
        help=f"the daemon: HOST:PORT or unix:/path (env: {ADDRESS_ENV}; "
        f"default: {DEFAULT_ADDRESS})",
    )
    ctl.add_argument(
        "--tenant",
        default=os.environ.get(TENANT_ENV, ""),
        help=f"act in this tenant (env: {TENANT_ENV}; default: the daemon's 'default', "
        "or with auth on the credential's own tenant)",
    )
    _add_credentials(ctl)
    ctl.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="deadline of each call (verify and gc: at least an hour) (default: 30)",
    )
    ctl.add_argument("--json", action="store_true", help="print JSON for scripts")
    ctl.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="progress line on stderr for verify, gc, export and import (auto: on a terminal)",
    )
    sub = ctl.add_subparsers(dest="ctl_command", metavar="COMMAND", required=True)

    health = sub.add_parser("health", help="exit 0 if the daemon reports SERVING, else 1")
    health.add_argument("--service", default="", help="a service name (default: the server)")

    sessions = sub.add_parser("sessions", help="list, show or delete sessions")
    sessions_sub = sessions.add_subparsers(dest="sessions_command", metavar="ACTION", required=True)
    ls = sessions_sub.add_parser("ls", help="list sessions ordered by ID")
    ls.add_argument("--prefix", default="", help="only IDs starting with this")
    show = sessions_sub.add_parser("show", help="one session in detail")
    show.add_argument("session_id")
    rm = sessions_sub.add_parser("rm", help="delete sessions and their checkpoints")
    rm.add_argument("session_ids", nargs="+", metavar="session_id")

    checkpoints = sub.add_parser("checkpoints", help="list checkpoints")
    cp_sub = checkpoints.add_subparsers(dest="checkpoints_command", metavar="ACTION", required=True)
    cp_ls = cp_sub.add_parser("ls", help="checkpoints of a session, newest first")
    cp_ls.add_argument("session_id")
    cp_ls.add_argument("--namespace", default=None, help="only this namespace")
    cp_ls.add_argument("--limit", type=int, default=0, help="at most this many (0 = all)")

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


def _add_credentials(ctl: argparse.ArgumentParser) -> None:
    """--token and --tls* flags; unset ones come from the environment in the SDK."""
    ctl.add_argument(
        "--token-file",
        metavar="FILE",
        help="read the bearer token from FILE (env: STRATAD_TOKEN_FILE, or the token itself "
        "in STRATAD_TOKEN; a token on the command line would show in ps)",
    )
    ctl.add_argument(
        "--tls",
        action="store_true",
        default=None,
        help="connect with TLS, trusting the system's CAs unless --tls-ca (env: STRATAD_TLS)",
    )
    for flag, env, text in (
        ("--tls-ca", "STRATAD_TLS_CA", "PEM CA file that signed the daemon's certificate"),
        ("--tls-cert", "STRATAD_TLS_CERT", "client certificate (PEM) for mTLS"),
        ("--tls-key", "STRATAD_TLS_KEY", "the client certificate's key (PEM)"),
        (
            "--tls-server-name",
            "STRATAD_TLS_SERVER_NAME",
            "name to verify the daemon's certificate for, if not the host dialed",
        ),
    ):
        ctl.add_argument(flag, metavar="FILE" if "name" not in flag else "NAME",
                         help=f"{text}; implies --tls (env: {env})")  # fmt: skip


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


def main(args: argparse.Namespace) -> int:
    from stratad.ctl.commands import run

    return run(args)


__all__ = ["ADDRESS_ENV", "DEFAULT_ADDRESS", "TENANT_ENV", "add_parser", "main"]
