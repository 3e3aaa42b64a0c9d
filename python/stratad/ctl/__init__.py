"""``stratad ctl``: operate a running daemon over its gRPC API.

    stratad ctl [--address ADDR] [--tenant T] [--json] COMMAND ... [--json ...]

The global options may come before or after the command
(``stratad ctl sessions ls --json``); ``stratad ctl --help`` lists them, a
command's own ``--help`` only its options and a line pointing there.

    health                         SERVING or not (exit 0 / 1); the container's health check
    sessions ls [--prefix P]       sessions of the tenant
    sessions show ID               one session
    sessions rm ID                 delete a session and its checkpoints
    sessions watch ID              stream the session's events until Ctrl-C
    checkpoints ls SESSION         checkpoints, newest first
    checkpoints show SESSION CP    one checkpoint: metadata, parents, size, decoded state
    checkpoints diff SESSION A B   what changed between two states (JSON paths)
    state get SESSION [-o FILE]    a state's bytes (latest, or --checkpoint ID);
                                   --decode langgraph: a StratadSaver checkpoint as JSON
    verify                         re-hash every object of the tenant (exit 3 on problems)
    gc                             collect garbage
    stats                          store statistics
    export SESSION -o FILE         the session as one portable archive (see ctl/archive.py)
    import FILE                    re-create an exported session; refuses a damaged archive
    token new [--tenant T] [--role R]  a random token and its identities-file entry (offline)
    token hash                     the SHA-256 digest of a token read from stdin (offline)
    completion bash|zsh|fish       a shell completion script for `stratad` (offline)

Connection flags default to the SDK's variables (`stratad.sdk.connection`):
STRATAD_ADDRESS, STRATAD_TENANT, STRATAD_TOKEN / STRATAD_TOKEN_FILE, STRATAD_TLS,
STRATAD_TLS_CA, STRATAD_TLS_CERT, STRATAD_TLS_KEY, STRATAD_TLS_SERVER_NAME.

Importing this package imports only the argument parser (``stratad --version``
stays fast); the commands are imported when one runs. The modules:

- `stratad.ctl.parser`: the argument parser (argparse only);
- `stratad.ctl.commands`: ``run``: the table of commands and the exit code of a failure;
- `stratad.ctl.context`: ``Ctl`` (what a command gets), exit codes, output formatting;
- `stratad.ctl.sessions`: ``sessions ls|show|rm|watch``;
- `stratad.ctl.checkpoints`: ``checkpoints ls|show|diff`` and ``state get``;
- `stratad.ctl.maintenance`: ``health``, ``verify``, ``gc``, ``stats``,
  ``replication status``, ``restore --from-remote``;
- `stratad.ctl.archive_export`, `stratad.ctl.archive_import`: ``export`` and ``import``;
- `stratad.ctl.archive`: the archive format they write and read;
- `stratad.ctl.tokens`: ``token new|hash`` (offline);
- `stratad.ctl.completion`: ``completion bash|zsh|fish`` (offline);
- `stratad.ctl.decode`, `stratad.ctl.progress`: state decoding, the progress line.

Exit codes: 0 success, 1 the operation failed (message on stderr), 2 usage,
3 verify found corrupt objects or damaged sessions.
"""

from __future__ import annotations

import argparse

from stratad.ctl.parser import (
    ADDRESS_ENV,
    DECODERS,
    DEFAULT_ADDRESS,
    GLOBAL_OPTIONS_EPILOG,
    SHELLS,
    TENANT_ENV,
    add_parser,
    subcommands,
)


def main(args: argparse.Namespace, root_parser: argparse.ArgumentParser) -> int:
    """Run a ``stratad ctl`` command; ``root_parser`` (the whole ``stratad``
    command's) is what ``ctl completion`` describes."""
    from stratad.ctl.commands import run

    return run(args, root_parser)


__all__ = [
    "ADDRESS_ENV",
    "DECODERS",
    "DEFAULT_ADDRESS",
    "GLOBAL_OPTIONS_EPILOG",
    "SHELLS",
    "TENANT_ENV",
    "add_parser",
    "main",
    "subcommands",
]
