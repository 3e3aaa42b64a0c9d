"""``stratad ctl``'s dispatch: `run` finds the command the arguments name in
`COMMANDS` (the offline ``token`` and ``completion`` need no daemon), runs it
with a `Ctl`, and turns a failure into its message and exit code. The commands
are in the modules named in `stratad.ctl`; the list and exit codes are there too."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator

from stratad.ctl.archive import ArchiveError
from stratad.ctl.archive_export import cmd_export
from stratad.ctl.archive_import import cmd_import
from stratad.ctl.checkpoints import (
    cmd_checkpoints_diff,
    cmd_checkpoints_ls,
    cmd_checkpoints_show,
    cmd_state_get,
)
from stratad.ctl.context import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    Ctl,
    connection_of,
)
from stratad.ctl.maintenance import (
    cmd_gc,
    cmd_health,
    cmd_replication_status,
    cmd_restore,
    cmd_stats,
    cmd_verify,
)
from stratad.ctl.sessions import (
    cmd_sessions_ls,
    cmd_sessions_rm,
    cmd_sessions_show,
    cmd_sessions_watch,
)
from stratad.ctl.tokens import run_token
from stratad.errors import StratadError, UnavailableError


def run(args: argparse.Namespace, root_parser: argparse.ArgumentParser) -> int:
    if args.ctl_command == "token":  # offline: no daemon, no connection
        return run_token(args)
    if args.ctl_command == "completion":
        from stratad.ctl.completion import completion_script

        sys.stdout.write(completion_script(args.shell, root_parser))
        return EXIT_OK
    try:
        connection = connection_of(args)
    except (OSError, ValueError) as exc:
        print(f"stratad ctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    ctl = Ctl(connection, timeout=args.timeout, json=args.json, progress_mode=args.progress)
    command = args.ctl_command
    sub = getattr(args, f"{command}_command", None)
    handler = COMMANDS[(command, sub) if sub else (command,)]
    try:
        return handler(ctl, args)
    except ArchiveError as exc:
        ctl.note(f"refusing the archive: {exc.message}")
        return EXIT_FAILED
    except UnavailableError as exc:
        ctl.note(f"cannot reach the daemon at {ctl.address}: {exc.message}")
        return EXIT_FAILED
    except StratadError as exc:
        ctl.note(exc.message or type(exc).__name__)
        return EXIT_FAILED
    except OSError as exc:
        ctl.note(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
        return EXIT_FAILED
    except KeyboardInterrupt:
        ctl.note("interrupted")
        return EXIT_INTERRUPTED
    finally:
        ctl.close()


def _iter_commands() -> Iterator[tuple[tuple[str, ...], Callable[[Ctl, argparse.Namespace], int]]]:
    yield ("health",), cmd_health
    yield ("sessions", "ls"), cmd_sessions_ls
    yield ("sessions", "show"), cmd_sessions_show
    yield ("sessions", "rm"), cmd_sessions_rm
    yield ("sessions", "watch"), cmd_sessions_watch
    yield ("checkpoints", "ls"), cmd_checkpoints_ls
    yield ("checkpoints", "show"), cmd_checkpoints_show
    yield ("checkpoints", "diff"), cmd_checkpoints_diff
    yield ("state", "get"), cmd_state_get
    yield ("verify",), cmd_verify
    yield ("gc",), cmd_gc
    yield ("stats",), cmd_stats
    yield ("replication", "status"), cmd_replication_status
    yield ("restore",), cmd_restore
    yield ("export",), cmd_export
    yield ("import",), cmd_import


COMMANDS: dict[tuple[str, ...], Callable[[Ctl, argparse.Namespace], int]] = dict(_iter_commands())

__all__ = ["COMMANDS", "EXIT_FAILED", "EXIT_OK", "EXIT_PROBLEMS", "Ctl", "run"]
